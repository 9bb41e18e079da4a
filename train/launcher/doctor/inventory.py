"""GpuInventory: the GPUs as NVML (the driver) and as torch (the CUDA runtime) see them, asked once per doctor
run. torch is imported here, inside the probe, so that `trainstack doctor --help` and the CLI stay quick, and only
where CUDA's driver library loads: elsewhere torch would see no GPU, and a CPU host's launch skips its import."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from trainstack.train.launcher.cuda_devices import cuda_driver_loads


@dataclass(frozen=True)
class GpuInventory:
    driver_found: bool
    """False when NVML's library or the kernel driver is absent: a CPU-only host, a container without GPUs."""
    nvml_error: str = ""
    """NVML was found but failed (e.g. driver/library version mismatch after a driver upgrade)."""
    uuids: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    driver_version: str = ""
    driver_cuda_version: str = ""
    """Newest CUDA version the driver supports, "12.4"."""
    torch_version: str = ""
    torch_cuda_version: str = ""
    """CUDA version torch was built with; "" for a CPU build."""
    torch_device_count: int = 0
    torch_warning: str = ""
    """What torch said while counting devices (it warns, rather than raises, when CUDA cannot start)."""


def cuda_version_text(encoded: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def probe_gpus() -> GpuInventory:
    return GpuInventory(**_probe_nvml(), **(_probe_torch() if cuda_driver_loads() else {}))


def _probe_nvml() -> dict:
    import pynvml

    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded):
        return {"driver_found": False}
    except pynvml.NVMLError as error:
        return {"driver_found": True, "nvml_error": str(error)}
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return {
            "driver_found": True,
            "uuids": tuple(pynvml.nvmlDeviceGetUUID(handle) for handle in handles),
            "names": tuple(pynvml.nvmlDeviceGetName(handle) for handle in handles),
            "driver_version": pynvml.nvmlSystemGetDriverVersion(),
            "driver_cuda_version": cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion()),
        }
    except pynvml.NVMLError as error:
        return {"driver_found": True, "nvml_error": str(error)}
    finally:
        pynvml.nvmlShutdown()


def _probe_torch() -> dict:
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count()
    return {
        "torch_version": torch.__version__,
        "torch_cuda_version": torch.version.cuda or "",
        "torch_device_count": count,
        "torch_warning": " ".join(str(warning.message).splitlines()[0] for warning in caught),
    }
