"""The run-directory lease: one writer per run directory, on local disks and network volumes (NFS, RWX claims).

Each node's launcher holds its lease file (`RunDir.lease_file`, trainstack/rundir.py: RUN_DIR/lease/node-<n>.json),
created with O_CREAT|O_EXCL (atomic on local disks and on NFS) and removed when the launcher is done. The file
names its holder: run id, node rank, host, PID and the PID's start time. Nodes of one job share a run id
(`TRAINSTACK_RUN_ID`), so they are one holder; a launcher with another run id is refused while any node of the
holding run is alive.

Alive means, in this order:
- a shared flock on its file is held, by the holder or by a process that writes the run directory for it: the
  agent and forked CPU ranks inherit the holder's open file, ranks started afresh lock the file themselves
  (`hold_for_life`). The kernel drops each when its process dies; where a filesystem does not carry locks between
  clients, a free lock proves nothing, so it only ever counts as a sign of life;
- same machine (same boot and PID namespace): its PID still runs and started when the file says (not a reuse);
- another machine: its heartbeat (the file's mtime, touched every timeout/12 seconds) is younger than the
  timeout. Touching keeps the inode, so the flock stays on the file a newcomer opens.

A stale holder is removed under a takeover guard (another O_EXCL file), after checking that the file is still
the one judged stale, so two takers cannot both win; the creation that follows is O_EXCL again.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.lease_lock import lock
from trainstack.rundir import DEFAULT_LEASE_TIMEOUT_SECONDS, LEASE_TIMEOUT_ENV, RunDir

HEARTBEATS_PER_TIMEOUT = 12  # a holder misses 11 heartbeats in a row before it is judged stale
GUARD_STALE_SECONDS = 30.0  # a takeover takes milliseconds; a guard this old belongs to a taker that died
POLL_SECONDS = 1.0
_AGAIN = object()  # an attempt that met a moving target: look again at once


class LeaseHeld(ConfigError):
    """Another live launcher holds the run directory."""


@dataclass(frozen=True)
class Holder:
    """What a lease file says about the launcher holding it."""

    run_id: str
    node_rank: int
    host: str
    machine: str
    pid: int
    pid_started: float
    since: float
    timeout: float
    token: str

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host} PID {self.pid} (run {self.run_id}, node {self.node_rank}) since {since}"


def this_machine() -> str:
    """A PID means the same process only within one boot and one PID namespace (containers have their own)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return socket.gethostname()
    return f"{boot}/{namespace}"


def process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int, started: float) -> bool:
    """True when `pid` runs and is the process that started at `started` (a reused PID started later)."""
    actual = process_start_time(pid)
    return actual is not None and abs(actual - started) < 1.0


def lease_timeout(value: float | None) -> float:
    """The flag wins over TRAINSTACK_LEASE_TIMEOUT, which wins over the default."""
    if value is None:
        raw = os.environ.get(LEASE_TIMEOUT_ENV)
        try:
            value = float(raw) if raw else DEFAULT_LEASE_TIMEOUT_SECONDS
        except ValueError:
            raise ConfigError(f"{LEASE_TIMEOUT_ENV}={raw!r} must be a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"--lease-timeout must be positive seconds, got {value:g}")
    return value


class RunDirLease:
    """Take with `acquire()`, give back with `release()`; a heartbeat thread keeps it fresh in between."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        node_rank: int = 0,
        timeout: float = DEFAULT_LEASE_TIMEOUT_SECONDS,
        *,
        say: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        machine: str | None = None,
        pid: int | None = None,
        alive: Callable[[int, float], bool] = process_alive,
        dir_flag: str = "--output-dir",
    ):
        self.run_dir = Path(run_dir)
        self.dir_flag = dir_flag  # the option that chose the run directory, for the line that refuses it
        self.folder = RunDir(self.run_dir).lease
        self.path = RunDir(self.run_dir).lease_file(node_rank)
        self.timeout = timeout
        self.say = say or (lambda line: print(f"trainstack train: {line}", file=sys.stderr, flush=True))
        self.clock, self.alive = clock, alive
        pid = os.getpid() if pid is None else pid
        self.me = Holder(
            run_id=run_id,
            node_rank=node_rank,
            host=socket.gethostname(),
            machine=machine or this_machine(),
            pid=pid,
            pid_started=process_start_time(pid) or 0.0,
            since=0.0,
            timeout=timeout,
            token=secrets.token_hex(8),
        )
        self._fd: int | None = None
        self._made: list[Path] = []  # folders acquire() created, removed again on release when empty
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.lost = False

    # ---- taking and giving back -----------------------------------------------------------------------------
    def acquire(self, wait: float = 0.0) -> None:
        """Hold the lease, waiting up to `wait` seconds for a live holder to let go; raise LeaseHeld if it won't."""
        deadline = time.monotonic() + wait
        announced = False
        while True:
            holder = self._try_acquire()
            if holder is None:
                self._heartbeat = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
                self._heartbeat.start()
                return
            if time.monotonic() >= deadline:
                raise LeaseHeld(
                    f"{self.run_dir} is in use by another trainstack launcher: {self._holding(holder)}; wait for "
                    f"it to finish, pass --wait-for-lease SECONDS to wait for it, or choose another {self.dir_flag}"
                )
            if not announced:
                self.say(
                    f"{self.run_dir} is in use by {self._holding(holder)}; waiting up to {wait:g} s for it to finish"
                )
                announced = True
            time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))

    def release(self) -> None:
        if self._fd is None:
            return
        self._stop.set()
        if self._heartbeat:
            self._heartbeat.join()
        if self._still_mine():
            self.path.unlink(missing_ok=True)
        os.close(self._fd)  # drops the flock
        self._fd = None
        for folder in (self.folder, *reversed(self._made)):
            try:
                folder.rmdir()  # only when empty: another node's file, or the run's own files, keep it
            except OSError:
                break

    @property
    def fd(self) -> int | None:
        """The held lease file. Processes that write the run directory inherit it (`pass_fds`): its flock is then
        held until the last of them exits, even when the launcher itself is killed alone."""
        return self._fd

    def __enter__(self) -> RunDirLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- one attempt ----------------------------------------------------------------------------------------
    def _try_acquire(self) -> Holder | None:
        """None when the lease is now ours, else the live holder in the way. Nothing is written while one is."""
        while True:
            outcome = self._attempt()
            if outcome is not _AGAIN:
                return outcome

    def _attempt(self):
        holder = self._other_run_alive()
        if holder:
            return holder
        self._make_folders()
        me = Holder(**{**asdict(self.me), "since": self.clock()})
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            return self._slot_taken()
        except FileNotFoundError:  # a releasing holder removed the empty folder in between: look again
            return _AGAIN
        try:
            os.write(fd, (json.dumps(asdict(me)) + "\n").encode())
            os.fsync(fd)
        except OSError:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        lock(fd, fcntl.LOCK_SH, blocking_tries=20)
        # Two runs may have created their files at the same moment: each looks again once its own is there, and
        # whichever sees the other backs off (both may; neither has written anything else).
        holder = self._other_run_alive()
        if holder:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            return holder
        self._fd, self.me = fd, me
        return None

    def _make_folders(self) -> None:
        missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            if folder != self.folder:
                self._made.append(folder)

    def _slot_taken(self):
        """This node's file exists: a live launcher of this node (a replacement pod's case) or a stale one."""
        seen = self._inspect(self.path)
        if seen is None:  # released meanwhile
            return _AGAIN
        holder, heartbeat, locked = seen
        if holder is None:  # being written, or left empty by a launcher killed right after creating it
            if self.clock() - heartbeat <= self.timeout:
                time.sleep(0.05)
                return _AGAIN
            reason = "its lease file was left empty"
        else:
            reason = self._stale_reason(holder, heartbeat, locked)
            if reason is None:
                return holder
        if self._take_over(self.path, holder, reason, heartbeat):
            return _AGAIN
        # Another taker is at it, or the file changed or got locked since it was judged: in the way for now.
        if holder is None:
            time.sleep(0.05)
            return _AGAIN
        return holder

    def _other_run_alive(self) -> Holder | None:
        """A live holder of another run on another node's file; stale ones are taken over (removed) on the way.
        This node's own file is judged when creating it fails."""
        if not self.folder.is_dir():
            return None
        for path in RunDir(self.run_dir).lease_files():
            if path == self.path:
                continue
            seen = self._inspect(path)
            if seen is None or seen[0] is None or seen[0].run_id == self.me.run_id:
                continue  # gone, being written, or a node of our own run
            reason = self._stale_reason(seen[0], *seen[1:])
            if reason is None:
                return seen[0]
            self._take_over(path, seen[0], reason, seen[1])
        return None

    # ---- judging a holder -----------------------------------------------------------------------------------
    def _holding(self, holder: Holder) -> str:
        """Who holds the lease. A launcher killed while its ranks, which share its lease, still stop is gone
        itself: the line says so, or its PID would send the user looking for it."""
        if holder.machine == self.me.machine and not self.alive(holder.pid, holder.pid_started):
            return f"{holder.describe()}, whose processes still hold it while they stop (its PID is gone)"
        return holder.describe()

    def _inspect(self, path: Path) -> tuple[Holder | None, float, bool] | None:
        """(holder or None if unreadable, heartbeat time, lock held), or None when the file is gone. Opening the
        file (not stat on the path) makes an NFS client fetch fresh attributes: close-to-open consistency."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        except PermissionError:
            fd = os.open(path, os.O_RDONLY)
        try:
            heartbeat = os.fstat(fd).st_mtime
            # Retried: another launcher judging the same file holds it for microseconds while it probes, as this
            # probe does; only a holder keeps it (two takers that each saw the other's probe both backed off).
            locked = not lock(fd, fcntl.LOCK_EX, blocking_tries=20)
            text = os.read(fd, 1 << 16).decode(errors="replace")
        finally:
            os.close(fd)  # also drops the probe's lock
        try:
            holder = Holder(**json.loads(text))
        except (ValueError, TypeError):
            holder = None
        return holder, heartbeat, locked

    def _stale_reason(self, holder: Holder, heartbeat: float, locked: bool) -> str | None:
        """None while the holder is alive; else why it is not."""
        if locked:
            return None
        if holder.machine == self.me.machine:
            if self.alive(holder.pid, holder.pid_started):
                return None
            return f"its PID {holder.pid} is gone"
        timeout = max(self.timeout, holder.timeout)  # its heartbeats come at its own pace
        age = self.clock() - heartbeat
        if age <= timeout:
            return None
        return f"no heartbeat for {age:.0f} s (timeout {timeout:g} s)"

    def _take_over(self, path: Path, holder: Holder | None, reason: str, heartbeat: float) -> bool:
        """Remove a stale lease file, unless another taker is at it or the file changed since it was judged."""
        guard = path.with_name(path.name + ".takeover")
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            try:
                if self.clock() - guard.stat().st_mtime > GUARD_STALE_SECONDS:
                    guard.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            return False
        try:
            seen = self._inspect(path)
            if seen is None:
                return True
            current, current_heartbeat, locked = seen
            if locked or (current.token if current else current_heartbeat) != (holder.token if holder else heartbeat):
                return False
            path.unlink(missing_ok=True)
        finally:
            guard.unlink(missing_ok=True)
        who = holder.describe() if holder else "a launcher that died while taking it"
        self.say(f"took over the lease of {self.run_dir} from {who}: {reason}")
        return True

    # ---- while held -----------------------------------------------------------------------------------------
    def _still_mine(self) -> bool:
        assert self._fd is not None, "asked only while the lease is held"
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except OSError:
            return False

    def _beat(self) -> None:
        fd = self._fd  # held until release() has stopped this thread
        assert fd is not None, "the heartbeat starts once the lease is held"
        interval = self.timeout / HEARTBEATS_PER_TIMEOUT
        while not self._stop.wait(interval):
            try:
                os.utime(fd)
            except OSError:
                continue  # a network volume's hiccup: the next beat tries again, well within the timeout
            if not self.lost and not self._still_mine():
                self.lost = True
                self.say(
                    f"warning: the lease of {self.run_dir} was taken over: this launcher's heartbeats "
                    f"stopped for longer than {self.timeout:g} s"
                )
