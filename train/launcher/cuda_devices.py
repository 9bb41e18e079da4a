"""How many CUDA devices this process would see, asking torch (seconds to import) only where CUDA's driver
library is present: without it no CUDA device exists, and a CPU host's launcher and doctor stay torch-free."""

from __future__ import annotations

import ctypes
import sys


def cuda_driver_loads() -> bool:
    if sys.platform != "linux":
        return True  # only Linux's library name is known here: torch decides
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def cuda_device_count() -> int:
    if not cuda_driver_loads():
        return 0
    import torch

    return torch.cuda.device_count()
