"""The per-node agent: Accelerate's launcher (torchrun inside), reporting a failed rank in one line.

Accelerate ends a failed launch with an uncaught exception; the rank has already printed what went wrong, so the
agent's own traceback would only bury it.
"""

import subprocess
import sys

from accelerate.commands.launch import main
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from trainstack.errors import EXIT_PREEMPTED


def run() -> int:
    try:
        main()
    except ChildFailedError as failure:
        rank, first = failure.get_first_failure()
        if first.exitcode == EXIT_PREEMPTED:  # every rank stopped on purpose after the checkpoint
            return EXIT_PREEMPTED
        print(f"trainstack: rank {rank} exited with code {first.exitcode} (its log is above)", file=sys.stderr)
        return first.exitcode if first.exitcode > 0 else 1
    except subprocess.CalledProcessError as failure:
        return failure.returncode if failure.returncode > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
