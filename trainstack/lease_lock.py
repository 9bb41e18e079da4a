"""The run-directory lease's lock (trainstack/supervisor/lease.py): a shared flock on the lease file for each
process that holds the lease (the launcher, and whatever writes the run directory for it), an exclusive one, taken
and dropped at once, for a newcomer asking whether anyone holds it. On the shared ground: the ranks lock the file
too, and train/ does not import the supervisor."""

from __future__ import annotations

import errno
import fcntl
import os
import time


def lock(fd: int, kind: int, blocking_tries: int) -> bool:
    """flock `kind` (shared for a holder, exclusive for a probe) where the filesystem supports it; False only when
    another process holds a lock in the way."""
    for attempt in range(blocking_tries + 1):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True  # no flock here (ENOLCK, EOPNOTSUPP, a read-only descriptor on NFS): no signal
            if attempt < blocking_tries:
                time.sleep(0.01)  # a newcomer probing the file holds it for microseconds
    return False


_HELD_FOR_LIFE: list[int] = []


def hold_for_life(path: str) -> None:
    """This process shares the lease at `path`, its launcher's, until it exits: a rank started afresh (GPU ranks)
    does not inherit the launcher's open file as the agent and forked CPU ranks do, and without this a rerun could
    take the run directory while it still saves, its launcher and agent killed. A file already gone (its launcher
    let go) or a filesystem without flock: nothing to hold."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    if lock(fd, fcntl.LOCK_SH, blocking_tries=100):
        _HELD_FOR_LIFE.append(fd)
    else:
        os.close(fd)
