"""Debugging switches left on: each one is right while chasing a bug and costs throughput in a real run."""

from __future__ import annotations

from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status

# variable -> (values that switch it on, None: any but 0; its cost). NCCL's docs: *_DISABLE are for debugging.
DEBUG_SWITCHES = {
    "NCCL_P2P_DISABLE": (None, "GPU-to-GPU traffic detours through host memory instead of NVLink/PCIe P2P"),
    "NCCL_SHM_DISABLE": (None, "traffic between ranks on a node falls back to sockets"),
    "NCCL_IB_DISABLE": (None, "traffic between nodes uses TCP sockets instead of InfiniBand/RoCE"),
    "NCCL_DEBUG": (("INFO", "TRACE"), "every rank logs each communicator and connection (TRACE: every call)"),
    "CUDA_LAUNCH_BLOCKING": (None, "every kernel launch waits for the kernel to finish"),
    "TORCH_DISTRIBUTED_DEBUG": (("DETAIL",), "every collective is checked against the other ranks' first"),
}
OFF_VALUES = ("", "0")


def _is_on(value: str, on_values: tuple[str, ...] | None) -> bool:
    if on_values is None:
        return value.strip() not in OFF_VALUES
    return value.strip().upper() in on_values


def check_debug_switches(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    found = {
        name: cost
        for name, (on_values, cost) in DEBUG_SWITCHES.items()
        if name in config.env and _is_on(config.env[name], on_values)
    }
    if not found:
        return CheckResult(
            "debug-switches",
            Status.PASS,
            "no NCCL/CUDA debugging switch is on (" + ", ".join(DEBUG_SWITCHES) + ")",
        )
    return CheckResult(
        "debug-switches",
        Status.WARN,
        "; ".join(f"{name}={config.env[name]}: {cost}" for name, cost in found.items()),
        f"unset {' '.join(found)} once the bug they were set for is found (NCCL_DEBUG=WARN logs errors)",
    )
