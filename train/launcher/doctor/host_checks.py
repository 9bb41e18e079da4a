"""Host checks: shared memory for loader workers and NCCL, the memlock ulimit, loader workers against CPUs."""

from __future__ import annotations

import math
import os

from trainstack import thresholds
from trainstack.train.launcher.doctor.config import DoctorConfig, GiB, MiB
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status
from trainstack.units import human_bytes

# NCCL's shared-memory transport and proxy buffers per GPU rank: the figure diagnose's comm-bound evidence also uses.
NCCL_SHM_BYTES_PER_RANK = int(thresholds.SHM_PER_RANK.value * MiB)
DOCKER_DEFAULT_SHM = 64 * MiB


def shm_bytes_needed(config: DoctorConfig, gpus: GpuInventory) -> int:
    ranks = config.ranks_on_this_node(gpus)
    loaders = ranks * config.num_workers * config.prefetch_factor * config.loader_batch_bytes
    nccl = ranks * NCCL_SHM_BYTES_PER_RANK if gpus.torch_device_count and ranks > 1 else 0
    return loaders + nccl


def _shm_fix(path: str, needed: int) -> str:
    size = max(1, math.ceil(2 * needed / GiB))
    return (
        f"give {path} at least {size} GiB: docker run --shm-size={size}g (or --ipc=host); "
        f"compose: shm_size: {size}gb; Kubernetes: mount an emptyDir {{medium: Memory, sizeLimit: {size}Gi}} "
        f"at {path}"
    )


def check_shared_memory(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    path = str(config.shm_path)
    needed = shm_bytes_needed(config, gpus)
    try:
        stats = os.statvfs(path)
    except OSError as error:
        return CheckResult("shm", Status.FAIL, f"{path} cannot be read ({error.strerror})", _shm_fix(path, needed))
    total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    ranks = config.ranks_on_this_node(gpus)
    need = (
        f"need ~{human_bytes(needed)} for {ranks} rank(s) x {config.num_workers} loader worker(s) x "
        f"{config.prefetch_factor} prefetched batch(es)" + (" + NCCL" if gpus.torch_device_count and ranks > 1 else "")
    )
    if total < needed:
        default = " (Docker's default)" if total == DOCKER_DEFAULT_SHM else ""
        return CheckResult(
            "shm",
            Status.FAIL,
            f"{path} is {human_bytes(total)}{default}, {need}: workers die with 'Bus error', NCCL fails",
            _shm_fix(path, needed),
        )
    if free < needed:
        return CheckResult(
            "shm",
            Status.WARN,
            f"{path} has {human_bytes(free)} free of {human_bytes(total)}, {need}; the rest is taken "
            "(stale torch_*/nccl-* segments from a crashed run?)",
            f"ls -la {path} and delete segments no running process owns, or " + _shm_fix(path, needed),
        )
    return CheckResult("shm", Status.PASS, f"{path} has {human_bytes(free)} free of {human_bytes(total)}, {need}")


def check_memlock(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    limit = config.memlock_bytes
    if limit is None:
        return CheckResult("memlock", Status.PASS, "memlock ulimit unlimited")
    if not gpus.torch_device_count and config.nnodes == 1:
        return CheckResult(
            "memlock",
            Status.PASS,
            f"memlock ulimit {human_bytes(limit)} (only GPU and RDMA runs lock memory)",
        )
    return CheckResult(
        "memlock",
        Status.WARN,
        f"memlock ulimit {human_bytes(limit)}: pinned host buffers and NCCL over InfiniBand/RoCE need it unlimited",
        "docker run --ulimit memlock=-1; compose: ulimits: {memlock: -1}; Kubernetes: raise LimitMEMLOCK in "
        "the container runtime's service (containerd/CRI-O), pods cannot set ulimits",
    )


def check_cpus(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    ranks = config.ranks_on_this_node(gpus)
    processes = ranks * (config.num_workers + 1)
    counted = (
        f"{ranks} rank(s) x ({config.num_workers} loader worker(s) + 1) = {processes} busy processes "
        f"on {config.cpu_count} CPU(s)"
    )
    if processes > config.cpu_count:
        workers = max(0, config.cpu_count // ranks - 1)
        return CheckResult(
            "cpus",
            Status.WARN,
            f"{counted}: oversubscribed, the workers slow the ranks they feed",
            f"--num-workers {workers} (or give the container more CPUs)",
        )
    if config.num_workers == 0 and gpus.torch_device_count:
        workers = max(1, min(4, config.cpu_count // ranks - 1))
        return CheckResult(
            "cpus",
            Status.WARN,
            f"{counted}: each rank loads its own batches while its GPU waits",
            f"--num-workers {workers}",
        )
    return CheckResult("cpus", Status.PASS, counted)
