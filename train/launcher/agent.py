"""The per-node agent: Accelerate's launcher (torchrun inside), reporting a failed rank in one line.

Accelerate ends a failed launch with an uncaught exception; the rank has already printed what went wrong, so the
agent's own traceback would only bury it. The line names the rank that failed first for a reason of its own, with
its error, read from torchrun's error files (train/rank/outcome.py, `report_failure`).
"""

import os
import subprocess
import sys

from accelerate.commands.launch import main
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from trainstack.errors import EXIT_PREEMPTED
from trainstack.rundir import FAILURE_FD_ENV, FAILURE_NOTE_KEY


def first_cause(failure: ChildFailedError) -> int:
    """The global rank whose failure caused the others. A rank that only lost its connection to another is never
    the cause while one that failed on its own is known: of those, the first by the note's clock (torchrun's own
    timestamps are whole seconds, too coarse when the peers follow within one). A rank that left no note (killed,
    crashed) comes next, the first by torchrun's clock; then torchrun's first failure."""
    notes = {rank: process.error_file_data.get(FAILURE_NOTE_KEY) for rank, process in failure.failures.items()}
    own = {rank: note["time"] for rank, note in notes.items() if isinstance(note, dict) and not note["peer_lost"]}
    if own:
        return min(own, key=own.get)
    silent = {rank: failure.failures[rank].timestamp for rank, note in notes.items() if note is None}
    return min(silent, key=lambda rank: (silent[rank], rank)) if silent else failure.get_first_failure()[0]


def failure_line(failure: ChildFailedError, rank: int) -> str:
    process = failure.failures[rank]
    if FAILURE_NOTE_KEY in process.error_file_data:
        return f"rank {rank}: {process.message}"
    return f"rank {rank} exited with code {process.exitcode} (its log is above)"


def announce(line: str) -> None:
    """To the launcher's pipe, which prints it as its last line; on stderr when run without the launcher."""
    descriptor = os.environ.get(FAILURE_FD_ENV)
    if descriptor:
        os.write(int(descriptor), (line + "\n").encode())
    else:
        print(f"trainstack: {line}", file=sys.stderr)


def run() -> int:
    try:
        main()
    except ChildFailedError as failure:
        rank = first_cause(failure)
        first = failure.failures[rank]
        if first.exitcode == EXIT_PREEMPTED:  # every rank stopped on purpose after the checkpoint
            return EXIT_PREEMPTED
        announce(failure_line(failure, rank))
        return first.exitcode if first.exitcode > 0 else 1
    except subprocess.CalledProcessError as failure:
        return failure.returncode if failure.returncode > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
