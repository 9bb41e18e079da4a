"""A write the storage refused (no space, a quota, a read-only file system, no permission), as one line and exit 69.

Each place that writes into the run directory (a checkpoint, telemetry, the summary, the report) turns such an
error into a `WriteFailure` naming what could not be written, where, and the free space there; it removes what it
had half-written, and whoever reports the failure adds which checkpoint a rerun resumes from. This is what
PostgreSQL and etcd do on ENOSPC: name the path, leave nothing half-written looking whole, restart from what was
durable. Any other error is not a storage failure and is left to propagate as it is.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import suppress
from pathlib import Path

from trainstack.errors import RuntimeFailure
from trainstack.units import human_bytes

# errno -> (what the storage said, what the user can do about it)
CAUSES = {
    errno.ENOSPC: ("no space left on device", "free space there"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or raise the quota"),
    errno.EROFS: ("read-only file system", "mount it read-write or choose another --output-dir"),
    errno.EACCES: ("permission denied", "give this user write access or choose another --output-dir"),
    errno.EPERM: ("operation not permitted", "give this user write access or choose another --output-dir"),
    errno.EIO: ("input/output error", "check the storage device"),
}
# torch's zip writer reports a failed write as a RuntimeError without an errno, e.g. "[enforce fail at
# inline_container.cc:672] . unexpected pos 403584 vs 403472" or "basic_ios::clear: iostream error".
TORCH_WRITE_ERRORS = ("unexpected pos", "PytorchStreamWriter failed", "basic_ios::clear", "iostream error")
# Below this much free space, a torch write error is taken for a full disk.
NEARLY_FULL_BYTES = 1 << 20
CUT_SHORT = (
    "a write cut short (a full disk, a quota or a device error)",
    "free space there or check the storage device",
)
"""A torch write error with space left: the errno is lost, and the free space read after it need not be what the
write met. A quota leaves the file system's free space as it was; so does a device error; and a full disk has room
again once a peer rank removed its half-written checkpoint (it removes it at once, to leave room for the summary)."""


class WriteFailure(RuntimeFailure):
    """A write into the run directory that the storage refused; its message is one line."""


def existing_folder(path: Path) -> Path:
    """`path` or its nearest ancestor that exists: where a path that could not be created would have been."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: Path) -> str:
    """'4.0 KiB free of 12.0 MiB' on the file system holding `path`; 'free space unknown' if it cannot be read."""
    try:
        usage = shutil.disk_usage(existing_folder(path))
    except OSError:
        return "free space unknown"
    return f"{human_bytes(usage.free)} free of {human_bytes(usage.total)}"


def storage_cause(error: BaseException, path: Path) -> tuple[str, str] | None:
    """What the storage said to `error` writing `path`, and what the user can do about it; None when it is no
    storage failure."""
    if isinstance(error, OSError):
        return CAUSES.get(error.errno) if error.errno is not None else None
    if isinstance(error, RuntimeError) and any(text in str(error) for text in TORCH_WRITE_ERRORS):
        try:
            free = shutil.disk_usage(existing_folder(path)).free
        except OSError:
            return CUT_SHORT
        return CAUSES[errno.ENOSPC] if free < NEARLY_FULL_BYTES else CUT_SHORT
    return None


def write_failure(error: BaseException, what: str, path: Path) -> WriteFailure | None:
    """`error`, met writing `what` (e.g. "checkpoint step 15") to `path`, as one line; None when it is not a
    storage failure. Call it before removing the half-written files: the free space is what the write met."""
    cause = storage_cause(error, path)
    if cause is None:
        return None
    where = Path(getattr(error, "filename", None) or path)
    said, remedy = cause
    return WriteFailure(f"{said} writing {what} to {where} ({free_space(where)}); {remedy}")


def write_atomically(path: Path, text: str, what: str) -> None:
    """`text` into `path` through `<name>.tmp` and a rename: a reader sees the old file or the new one, never half.
    Raises WriteFailure, the temporary file removed, when the storage refuses it."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as error:
        failure = write_failure(error, what, path)
        with suppress(OSError):  # a read-only file system refuses this too; the next write replaces it
            temporary.unlink(missing_ok=True)
        if failure is None:
            raise
        raise failure from None
