"""DoctorConfig: what the run will ask of this host, and where to look. Every default is the real system's, so
`DoctorConfig()` checks this machine; tests pass their own shm path, environment, CPU count and GPU facts."""

from __future__ import annotations

import dataclasses
import math
import os
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainstack.errors import ConfigError
from trainstack.rundir import DEFAULT_EXPORTER_HOST, DEFAULT_EXPORTER_PORT, DEFAULT_MASTER_PORT, check_port
from trainstack.train.launcher.doctor.checkpoint_size import estimate_checkpoint_bytes
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.launch_config import CPU_STAND_IN_RANKS
from trainstack.train.rank.config import TrainConfig

MiB = 1 << 20
GiB = 1 << 30
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# `trainstack train` alone; Any: each option's default has its own type
TRAIN_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in dataclasses.fields(TrainConfig)}


def token_batch_bytes(batch_size: int, seq_len: int) -> int:
    """A trainstack token batch: input_ids, attention_mask and labels, int64, batch x seq_len each."""
    return batch_size * seq_len * 8 * 3


def usable_cpu_count(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (`docker run --cpus 4`
    leaves the mask at every host core, so os.cpu_count() would overstate what a container gets)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    return max(1, min(cpus, math.ceil(int(quota) / int(period))))


def memlock_soft_limit() -> int | None:
    """The locked-memory limit in bytes, None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class DoctorConfig:
    output_dir: Path = Path(TRAIN_DEFAULTS["output_dir"])
    """Run directory: must be writable with room for checkpoints."""
    num_workers: int = TRAIN_DEFAULTS["num_workers"]
    """Data-loader worker processes per rank."""
    prefetch_factor: int = TRAIN_DEFAULTS["prefetch_factor"]
    """Batches each loader worker keeps ready in shared memory until its rank takes them."""
    nproc_per_node: int | None = None
    """Ranks on this node; None: one per visible GPU, or 2 CPU ranks without a GPU (the launcher's rule)."""
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    """Rendezvous port; node 0 opens it, so it must be free there."""
    exporter_host: str = DEFAULT_EXPORTER_HOST
    exporter_port: int = DEFAULT_EXPORTER_PORT
    """The exporter's port on this node (0: no exporter)."""
    loader_batch_bytes: int = token_batch_bytes(TRAIN_DEFAULTS["batch_size"], TRAIN_DEFAULTS["seq_len"])
    """Bytes one loader batch takes in shared memory (`token_batch_bytes` for trainstack's token batches); the
    default is `trainstack train`'s CPU batch, `for_run` gives the run's own (the CUDA defaults included)."""
    checkpoint_bytes: int | None = None
    """Room one checkpoint needs (model + optimizer state); None when it cannot be estimated."""
    keep_checkpoints: int = TRAIN_DEFAULTS["keep_checkpoints"]
    """Checkpoints kept; one more is written before the oldest is deleted."""
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    shm_path: Path = Path("/dev/shm")
    cpu_count: int = field(default_factory=usable_cpu_count)
    memlock_bytes: int | None = field(default_factory=memlock_soft_limit)
    """Locked-memory ulimit in bytes; None: unlimited."""
    gpus: GpuInventory | None = None
    """What NVML and torch see; None: ask them when the checks run."""
    read_batch_script: Callable[[str], str | None] | None = None
    """A Slurm job's batch script by job id (None: none to read); None: ask Slurm (slurm_checks.py)."""
    roll_call: bool = True
    """Whether the nodes meet in the run directory (slurm_checks.check_shared_run_dir), waiting up to
    TRAINSTACK_SHARED_DIR_TIMEOUT for each other; `trainstack train --skip-doctor` starts without waiting."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        object.__setattr__(self, "shm_path", Path(self.shm_path))
        at_least = {
            "num_workers": 0,
            "prefetch_factor": 1,
            "nnodes": 1,
            "node_rank": 0,
            "cpu_count": 1,
            "loader_batch_bytes": 0,
            "keep_checkpoints": 0,
        }
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(self, name)}")
        if self.checkpoint_bytes is not None and self.checkpoint_bytes < 0:
            raise ConfigError(f"checkpoint_bytes must be 0 or more, got {self.checkpoint_bytes}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank} must be below --nnodes {self.nnodes}")
        check_port("--master-port", self.master_port)
        check_port("--exporter-port", self.exporter_port, zero_means="to run no exporter")

    @classmethod
    def for_run(cls, train, launch, roll_call: bool = True) -> DoctorConfig:
        """The checks for what `trainstack train` is about to start: a TrainConfig and a LaunchConfig."""
        return cls(
            roll_call=roll_call,
            output_dir=Path(train.output_dir),
            num_workers=train.num_workers,
            prefetch_factor=train.prefetch_factor,
            keep_checkpoints=train.keep_checkpoints,
            checkpoint_bytes=estimate_checkpoint_bytes(train),
            loader_batch_bytes=token_batch_bytes(train.batch_size, train.seq_len),
            nproc_per_node=launch.nproc_per_node,
            nnodes=launch.nnodes,
            node_rank=launch.node_rank,
            master_addr=launch.master_addr,
            master_port=launch.master_port,
            exporter_host=launch.exporter_host,
            exporter_port=launch.exporter_port,
        )

    def ranks_on_this_node(self, gpus: GpuInventory) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return gpus.torch_device_count or CPU_STAND_IN_RANKS
