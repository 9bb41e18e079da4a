"""The NVML fake's host with a watched job's process on its one GPU, and what its process calls answer."""

from __future__ import annotations

import trainstack.monitoring.nvml_fake as fake

# GPU 0: the watched command beside a process of another user's, which stays whatever runs.
HOST = {
    "driver_version": "550.90.07",
    "gpus": [{"model": "h100_sxm5_80gb", "uuid": "GPU-0", "pci_bus_id": "00000000:18:00.0"}],
    "processes": {
        "0": [
            {"pid": 4242, "name": "/opt/conda/bin/python", "used_gpu_memory": 70_000, "watched": True},
            {"pid": 777, "name": "/usr/bin/Xorg", "used_gpu_memory": 1_000, "type": "C+G"},
        ]
    },
}


def listed(handle) -> dict[int, int]:
    return {p.pid: p.usedGpuMemory for p in fake.nvmlDeviceGetComputeRunningProcesses(handle)}


def name_of(pid: int) -> str | None:
    try:
        return fake.nvmlSystemGetProcessName(pid)
    except fake.NVMLError_NotFound:
        return None
