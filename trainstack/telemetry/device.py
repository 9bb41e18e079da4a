"""What a rank is: its device (the peak FLOP/s MFU divides by, the GPU's UUID NVML names it by, its precision),
and its identity on every series and record (rank, node, run, strategy)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

from trainstack.rundir import LAUNCHER_ENV, NNODES_ENV

# matmuls on the tensor cores, what precision "no" runs at with --tf32 (GPUs without TF32 have no entry).
PEAK_FLOPS = {
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "no": 51.2e12},
    "H100": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "no": 19.5e12},
    "L40S": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "no": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "no": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "no": 31.2e12},
    "V100": {"fp16": 125e12, "no": 15.7e12},
    "T4": {"fp16": 65e12, "no": 8.1e12},
}


def peak_flops(device: torch.device, precision: str, tf32: bool = False) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in name:
            return peaks.get("tf32" if precision == "no" and tf32 and "tf32" in peaks else precision)
    return None


def device_uuid(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"  # NVML's spelling, so the two join


@dataclass
class RankIdentity:
    rank: int
    local_rank: int
    node: str
    uuid: str
    run_id: str
    world_size: int
    nodes: int
    mixed_precision: str
    model: str
    dataset: str
    strategy: str = "ddp"
    launcher: str = ""
    """`trainstack train` or `watch` (rundir.LAUNCHER_ENV): whose knobs a verdict's fix names; "" unknown."""


def device_of(model: torch.nn.Module | None, accelerator) -> torch.device:
    if accelerator is not None:
        return accelerator.device
    if model is not None:
        for parameter in model.parameters():
            return parameter.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def precision_of(model: torch.nn.Module | None, accelerator) -> str:
    if accelerator is not None:
        return str(accelerator.mixed_precision)
    dtype = next((p.dtype for p in model.parameters()), torch.float32) if model is not None else torch.float32
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")


def tf32_allowed() -> bool:
    return torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"


def strategy_of(model: torch.nn.Module | None) -> str:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if isinstance(model, torch.nn.DataParallel):
        return "dataparallel"
    from torch.distributed.fsdp import FSDPModule

    if model is not None and any(isinstance(module, FSDPModule) for module in model.modules()):
        return "fsdp"
    return "single"


def rank_identity(
    model, accelerator, device: torch.device, precision: str, model_name: str | None, dataset: str, run_id: str
) -> RankIdentity:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if accelerator is not None:
        rank, local_rank, world = accelerator.process_index, accelerator.local_process_index, accelerator.num_processes
    elif distributed:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    else:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE") or os.environ.get(NNODES_ENV) or 1)
    inner = getattr(model, "module", model)
    return RankIdentity(
        rank=rank,
        local_rank=local_rank,
        node=socket.gethostname(),
        uuid=device_uuid(device),
        run_id=run_id,
        world_size=world,
        nodes=nodes,
        mixed_precision=precision,
        model=model_name or (type(inner).__name__ if inner is not None else ""),
        dataset=dataset,
        strategy=strategy_of(model),
        launcher=os.environ.get(LAUNCHER_ENV, ""),
    )
