"""The settings that make a GPU run fast: TF32, fused AdamW and torch.compile (the compile watch that keeps
compilation out of the step times and counts recompiles: trainstack/telemetry/compiles.py).

CPU ranks keep PyTorch's defaults (TF32 and the fused optimizer are CUDA features); `--compile` works on both.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def use_tf32(config, device: torch.device) -> None:
    """fp32 matmuls on the tensor cores as TF32 (10-bit mantissa): what nanoGPT and Lightning turn on. Convolutions
    already use TF32 by default in PyTorch; `--no-tf32` turns both off."""
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if config.tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = config.tf32


def make_optimizer(model: nn.Module, config, device: torch.device) -> torch.optim.Optimizer:
    # fused=True: one CUDA kernel updates every parameter, instead of several kernels per parameter group.
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=device.type == "cuda" and config.fused_adamw,
    )


def bucket_count(config) -> int:
    """How many sequence lengths a compiled model meets: multiples of --bucket-size up to --seq-len."""
    return math.ceil(config.seq_len / config.bucket_size)


def compile_in_place(model: nn.Module, config) -> None:
    """Compile before Accelerate wraps the model: `nn.Module.compile` keeps the module (no `_orig_mod.` in the
    state_dict, so checkpoints load with or without --compile) and DDP wraps the compiled module, never the
    other way round (Accelerate compiling the DDP wrapper: accelerate#3991). Static shapes: each length bucket
    compiles once to kernels specialised for it, instead of dynamic-shape kernels after the second length."""
    _allow_recompiles(bucket_count(config) + 1)
    model.compile(backend=config.compile_backend, dynamic=False)


def _allow_recompiles(limit: int) -> None:
    # Private torch API (torch 2.13): dynamo gives up compiling a frame after `recompile_limit` (default 8)
    # versions and runs it eagerly from then on. Each bucket is one version, so the limit must cover them.
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
