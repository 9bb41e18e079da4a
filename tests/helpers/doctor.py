"""The doctor's inputs fixed, so that no check depends on this machine unless a test says so."""

from __future__ import annotations

from trainstack.train.launcher.doctor import (
    DoctorConfig,
    GpuInventory,
)

CPU_HOST = GpuInventory(driver_found=False, torch_version="2.13.0+cpu")
UUIDS = ("GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2", "GPU-dddd-3")


def gpu_host(visible: int = 4, **changes) -> GpuInventory:
    facts = dict(
        driver_found=True,
        uuids=UUIDS,
        names=("NVIDIA H100 80GB HBM3",) * 4,
        driver_version="570.86",
        driver_cuda_version="12.8",
        torch_version="2.13.0+cu128",
        torch_cuda_version="12.8",
        torch_device_count=visible,
    )
    return GpuInventory(**{**facts, **changes})


def config(**changes) -> DoctorConfig:
    """Inputs that do not depend on this machine unless a test says so."""
    fixed = dict(env={}, cpu_count=64, memlock_bytes=None, gpus=CPU_HOST, exporter_port=0)
    return DoctorConfig(**{**fixed, **changes})
