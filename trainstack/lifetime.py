"""No process of a run outlives the process that started it (docs/training.md, "When a run dies").

The launcher starts the agent and the exporter; the agent starts the ranks. Each supervisor names itself to its
children in TRAINSTACK_SUPERVISOR_PID, and each child watches for it to be gone. When it is, the child stops as on a
preemption: a rank agrees with its peers at the next log interval, saves a checkpoint and exits; the agent passes
SIGTERM to its ranks (what the launcher would have done); the exporter stops serving. Nobody is left to enforce a
grace period then, so the orphan enforces its own, as systemd and Kubernetes stop a unit or a pod: SIGTERM, a grace
period (TRAINSTACK_STOP_GRACE seconds), then SIGKILL.

A thread polling getppid() against the PID the supervisor gave, rather than prctl(PR_SET_PDEATHSIG):
- the PID comes from the supervisor, so one that died before the watch began is seen at the first look (with
  PDEATHSIG that race needs this same check);
- PDEATHSIG fires when the *thread* that forked the child ends, not the process: a supervisor starting children
  from a helper thread would stop them while it still runs;
- a stop takes effect at the next log interval, seconds away, so a second's polling costs nothing that matters;
  one getppid() a second costs nothing at all.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainstack.errors import ConfigError
from trainstack.rundir import STOP_GRACE_ENV, SUPERVISOR_PID_ENV

if TYPE_CHECKING:
    import psutil  # imported where used: the exporter and the ranks watch their supervisor without it

POLL_SECONDS = 1.0
DEFAULT_STOP_GRACE_SECONDS = 60.0


def stop_grace() -> float:
    """Seconds an orphan has to stop, checkpoint included, before it is killed."""
    raw = os.environ.get(STOP_GRACE_ENV)
    try:
        grace = float(raw) if raw else DEFAULT_STOP_GRACE_SECONDS
    except ValueError:
        grace = -1.0
    if not grace > 0:
        raise ConfigError(f"{STOP_GRACE_ENV}={raw!r} must be a positive number of seconds")
    return grace


def describe_end(returncode: int) -> str:
    """How a child process ended, from its Popen returncode: "was killed by SIGKILL", "exited with code 1"."""
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def supervised_by_me(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child that must stop when this process is gone."""
    return {**env, SUPERVISOR_PID_ENV: str(os.getpid())}


def watch_supervisor(on_gone: Callable[[int], None]) -> bool:
    """Calls `on_gone(supervisor PID)` once, from a daemon thread, when the supervisor named in the environment is
    no longer this process's parent. False (and no thread) when no supervisor is named: started by hand."""
    named = os.environ.get(SUPERVISOR_PID_ENV)
    if not named:
        return False
    supervisor = int(named)

    def watch() -> None:
        while os.getppid() == supervisor:  # reparented (to init or a subreaper) once it is gone
            time.sleep(POLL_SECONDS)
        on_gone(supervisor)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    return True


def signal_new_children(parent: psutil.Process, signum: int, signalled: set[int]) -> None:
    """`signum` to each child of `parent` that is not in `signalled` yet, which then holds it: each gets it once."""
    import psutil

    try:
        children = parent.children()
    except psutil.NoSuchProcess:
        return
    for child in children:
        if child.pid not in signalled:
            signalled.add(child.pid)
            try:
                child.send_signal(signum)
            except psutil.NoSuchProcess:
                pass


def still_running(process: psutil.Process) -> bool:
    """True while `process` (the one psutil first saw at its PID, not a reuse) runs; a zombie has ended."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each process that still runs (psutil checks that a PID was not reused), and reap our children."""
    import psutil

    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


def wait_or_kill(processes: list[psutil.Process], timeout: float, say: Callable[[str], None]) -> None:
    """Waits up to `timeout` seconds for `processes` to end, then kills those left, saying how many."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    if alive:
        say(f"killing {len(alive)} process(es) of the run that outlived the grace period")
        kill_all(alive)


class Descendants:
    """Every process under a supervisor's child, as last seen. Once the child has ended, what it started has been
    re-parented away and can no longer be found from it; these are what must end before the run directory is let
    go."""

    LOOK_EVERY_SECONDS = 1.0  # a scan reads every process's /proc entry

    def __init__(self, pid: int):
        import psutil

        self._child = psutil.Process(pid)
        self._looked = float("-inf")
        self.seen: list[psutil.Process] = []

    def look(self) -> None:
        """Look again, unless the last look was under a second ago."""
        import psutil

        if time.monotonic() - self._looked < self.LOOK_EVERY_SECONDS:
            return
        self._looked = time.monotonic()
        try:
            found = self._child.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        # A child that has just ended (a zombie) has no children any more: keep what was seen while it ran.
        if still_running(self._child):
            self.seen = found

    def running(self) -> list[psutil.Process]:
        return [process for process in self.seen if still_running(process)]

    def left_running(self) -> list[psutil.Process]:
        """Once the child has ended: what was seen under it and still runs, with whatever still runs in its session
        (the supervisor starts it in a session of its own), which holds what it started and left between two
        looks. One scan of every process, so not at each poll."""
        import psutil

        left = {process.pid: process for process in self.running()}
        for process in psutil.process_iter():
            try:
                if (
                    process.pid not in left
                    and process.pid != self._child.pid
                    and os.getsid(process.pid) == self._child.pid
                ):
                    left[process.pid] = process
            except (ProcessLookupError, PermissionError):  # ended meanwhile, or not ours to ask
                continue
        return [process for process in left.values() if still_running(process)]
