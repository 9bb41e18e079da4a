"""The run directory: writable, with room for the checkpoints the run keeps."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status
from trainstack.units import human_bytes


def nearest_existing(path: Path) -> Path:
    """The directory the launcher will create the run directory in (or the run directory itself)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def check_output_dir(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    target = config.output_dir
    existing = nearest_existing(target)
    if not existing.is_dir():
        return CheckResult(
            "output-dir",
            Status.FAIL,
            f"{existing} exists and is not a directory",
            "pass --output-dir a directory path",
        )
    try:
        # A real write, not os.access: read-only mounts and full disks pass access() as root.
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".trainstack-doctor-") as probe:
            probe.write(b"x")
            probe.flush()
    except OSError as error:
        return CheckResult(
            "output-dir",
            Status.FAIL,
            f"cannot write in {existing} ({error.strerror})",
            "pass --output-dir a writable path; in a container mount a volume there that the container's "
            "user owns (read-only root filesystems allow writes only to mounted volumes)",
        )
    free = shutil.disk_usage(existing).free
    if config.keep_checkpoints == 0:
        return CheckResult(
            "output-dir",
            Status.PASS,
            f"{target} writable; {human_bytes(free)} free at {existing}; the run keeps no checkpoint "
            "(--keep-checkpoints 0)",
        )
    if config.checkpoint_bytes is None:
        return CheckResult(
            "output-dir",
            Status.PASS,
            f"{target} writable; {human_bytes(free)} free at {existing}; "
            f"no checkpoint-size estimate for a factory model or non-builtin data: make sure "
            f"{config.keep_checkpoints + 1} checkpoints fit",
        )
    # One checkpoint more than kept: the next is written in full before the oldest is deleted.
    needed = (config.keep_checkpoints + 1) * config.checkpoint_bytes
    room = (
        f"{human_bytes(free)} free at {existing}; {config.keep_checkpoints + 1} checkpoints of "
        f"~{human_bytes(config.checkpoint_bytes)} need {human_bytes(needed)}"
    )
    if free < config.checkpoint_bytes:
        return CheckResult(
            "output-dir",
            Status.FAIL,
            f"{room}: not even one checkpoint fits",
            "free disk space or pass --output-dir on a larger volume",
        )
    if free < needed:
        return CheckResult(
            "output-dir",
            Status.WARN,
            f"{room}: the run will fill the disk",
            "free disk space, lower --keep-checkpoints, or pass --output-dir on a larger volume",
        )
    return CheckResult("output-dir", Status.PASS, f"{target} writable; {room}")
