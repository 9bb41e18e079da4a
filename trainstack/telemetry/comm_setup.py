"""How a rank's gradient communication is set up, published once so that diagnose can say why it is slow: the
process group's backend, the NCCL switches in the rank's environment, and the size of /dev/shm, whose container
default (64 MiB) is too small for NCCL's shared-memory transport between the ranks of a node."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from trainstack import catalog

SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class CommSetup:
    backend: str
    """The default process group's backend ("nccl", "gloo"); empty before one is initialized."""
    switches: dict[str, str]
    """catalog.NCCL_SWITCH_LABELS label -> the value of its environment variable; empty where unset."""
    shm_bytes: int | None
    """Size of /dev/shm; None where the rank sees none."""

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ, shm_path: str = SHM_PATH) -> CommSetup:
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else ""
        switches = {label: environ.get(label.upper(), "") for label in catalog.NCCL_SWITCH_LABELS}
        try:
            stat = os.statvfs(shm_path)
        except OSError:  # no /dev/shm mounted here
            return cls(str(backend), switches, None)
        return cls(str(backend), switches, stat.f_blocks * stat.f_frsize)

    def publish(self, rank: str) -> None:
        """Into the rank's multiprocess files (the metrics directory must be set)."""
        catalog.rank_metric(catalog.TRAIN_COMM_SETUP_INFO).labels(rank=rank, backend=self.backend, **self.switches).set(
            1
        )
        if self.shm_bytes is not None:
            catalog.rank_metric(catalog.TRAIN_SHM_BYTES).labels(rank).set(self.shm_bytes)
