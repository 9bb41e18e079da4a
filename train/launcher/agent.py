"""The per-node agent: Accelerate's launcher (torchrun inside), reporting a failed rank in one line.

Accelerate ends a failed launch with an uncaught exception; the rank has already printed what went wrong, so the
agent's own traceback would only bury it. The line names the rank that failed first for a reason of its own, with
its error, read from the notes the ranks leave in a folder the agent makes (train/rank/outcome.py,
`report_failure`).

The agent runs in its own session (the launcher stops the ranks in order, not a terminal's Ctrl-C) and holds the
run directory's lease through the file it inherits, so it must never outlive the launcher: when the launcher is
gone, by any signal, SIGKILL included, the agent does what the launcher would have done on SIGTERM (passes it to
the ranks, which save a checkpoint and exit), kills what is left after the grace period, and so lets go of the lease
(trainstack/lifetime.py).
"""

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainstack.errors import EXIT_FAILED, EXIT_PREEMPTED
from trainstack.heap import imports_uncollected
from trainstack.lifetime import POLL_SECONDS, kill_all, signal_new_children, stop_grace, watch_supervisor
from trainstack.rundir import (
    FAILURE_FD_ENV,
    FAILURE_NOTES_ENV,
    FORK_RANKS_ENV,
    STOP_GRACE_ENV,
    SUPERVISOR_PID_ENV,
    USE_CPU_ENV,
    FailureNote,
    FirstFailure,
)
from trainstack.train.launcher.forked_ranks import fork_cpu_ranks

with imports_uncollected():  # torch, for the whole of the agent's life
    from accelerate.commands.launch import main
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

# torchrun's process supervision, which logs each rank's end and each signal it sends the others; for ranks it
# forked (train/launcher/forked_ranks.py), torch's multiprocessing logs the signals
RANK_PROCESS_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")
CLOSING_SIGNAL_MESSAGES = (
    "Sending process %s closing signal %s",
    "Closing process %s via signal %s",
    "Terminating process %s via signal SIGTERM",
)


class ExpectedStopsOnly(logging.Filter):
    """Drops torchrun's lines about a stop that went as planned; a crash's lines stay, without a traceback.

    A rank exits 75 only after the ranks agreed to stop and saved the checkpoint, so torchrun's
    `failed (exitcode: 75)` error says nothing the launcher's own "preempted" line does not. Its "Sending process N
    closing signal SIGTERM" warnings follow every first rank to end, also when a peer is only a moment behind: what
    it sends then is recorded by the exit codes, the failed rank's own line and the agent's one line. For a forked
    rank torchrun adds to its `failed (exitcode: N)` line the traceback of its own wait for the rank, which says
    nothing about the rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("failed (exitcode: %s)") and isinstance(record.args, tuple):
            record.exc_info, record.exc_text = None, None
            return record.args[0] != EXIT_PREEMPTED
        return not message.startswith(CLOSING_SIGNAL_MESSAGES)


def stop_ranks_then_leave(launcher_pid: int) -> None:
    """The launcher is gone: SIGTERM to each rank (those that start later too), as its stop would have sent them;
    the ranks' exits then end the launch as a preemption. Whatever still runs after the grace period is killed."""
    grace = stop_grace()
    print(
        f"trainstack: the launcher (PID {launcher_pid}) is gone; stopping the ranks: they save a checkpoint and "
        f"exit within {grace:g} s",
        file=sys.stderr,
        flush=True,
    )
    import psutil

    agent, signalled = psutil.Process(), set[int]()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        signal_new_children(agent, signal.SIGTERM, signalled)
        time.sleep(POLL_SECONDS)
    print(
        f"trainstack: the ranks did not stop within {grace:g} s ({STOP_GRACE_ENV}); killing them",
        file=sys.stderr,
        flush=True,
    )
    kill_all(agent.children(recursive=True))
    shutil.rmtree(os.environ[FAILURE_NOTES_ENV], ignore_errors=True)  # os._exit skips run()'s own removal
    os._exit(EXIT_FAILED)


def preempted(failure: ChildFailedError, notes: dict[int, FailureNote]) -> bool:
    """Every rank stopped on purpose after the checkpoint: each exited 75, or was ended by the SIGTERM torchrun
    sends the others once the first has exited (a rank past its own stop, tearing down, dies of it), and none
    failed on its own, which torchrun may not report (`first_failure`)."""
    codes = {process.exitcode for process in failure.failures.values()}
    failed = any(not note.peer_lost for note in notes.values())
    return EXIT_PREEMPTED in codes and codes <= {EXIT_PREEMPTED, -signal.SIGTERM} and not failed


def first_failure(failure: ChildFailedError, notes: dict[int, FailureNote]) -> FirstFailure:
    """The rank whose failure caused the others, from every note the ranks left (`notes`, by global rank), not only
    those of the ranks torchrun reports. A rank that only lost its connection to another is never the cause while
    one that failed on its own is known: of those, the first by the note's clock. A rank that left no note (killed,
    crashed) comes next, the first by torchrun's clock; then torchrun's first failure."""
    own = [note for note in notes.values() if not note.peer_lost]
    if own:
        cause = min(own, key=lambda note: note.time)
        return FirstFailure(f"rank {cause.rank}: {cause.message}", cause.exit_code, noted=True)
    silent = {rank: process.timestamp for rank, process in failure.failures.items() if rank not in notes}
    rank = min(silent, key=lambda rank: (silent[rank], rank)) if silent else failure.get_first_failure()[0]
    if rank in notes:
        return FirstFailure(f"rank {rank}: {notes[rank].message}", notes[rank].exit_code, noted=True)
    code = failure.failures[rank].exitcode
    return FirstFailure(f"rank {rank} exited with code {code} (its log is above)", code, noted=False)


def announce(first: FirstFailure) -> None:
    """To the launcher's pipe, which prints its line last; the line on stderr when run without the launcher, or
    when the launcher is gone (killed: its end of the pipe closed with it)."""
    descriptor = os.environ.get(FAILURE_FD_ENV)
    try:
        if descriptor:
            os.write(int(descriptor), first.to_json().encode())
            return
    except OSError:
        pass
    print(f"trainstack: {first.line}", file=sys.stderr)


def run() -> int:
    with tempfile.TemporaryDirectory(prefix="trainstack-failures-") as notes:
        os.environ[FAILURE_NOTES_ENV] = notes  # before anything can stop the ranks
        watch_supervisor(stop_ranks_then_leave)
        os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())  # the ranks (torchrun copies this environment) watch us
        for name in RANK_PROCESS_LOGGERS:
            logging.getLogger(name).addFilter(ExpectedStopsOnly())
        if os.environ.get(USE_CPU_ENV) == "1" and os.environ.get(FORK_RANKS_ENV) != "0":
            fork_cpu_ranks()
        try:
            main()
        except ChildFailedError as failure:
            noted = FailureNote.read_all(Path(notes))
            if preempted(failure, noted):
                return EXIT_PREEMPTED
            first = first_failure(failure, noted)
            announce(first)
            return first.exit_code if first.exit_code > 0 else EXIT_FAILED
        except subprocess.CalledProcessError as failure:
            return failure.returncode if failure.returncode > 0 else EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(run())
