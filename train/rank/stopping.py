"""How a rank is asked to stop: SIGTERM/SIGINT, or its agent being gone (trainstack/lifetime.py).

Installed first thing in `python -m trainstack.train.rank`, before torch loads (seconds): a SIGTERM that came while
it loaded would otherwise kill the rank outright, and the launcher would report a crash instead of a stop.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from trainstack.errors import EXIT_FAILED
from trainstack.lifetime import stop_grace, watch_supervisor
from trainstack.rundir import STOP_GRACE_ENV


class StopRequested:
    """Only sets a flag: the ranks agree on it at the next log interval and stop together after the step that
    follows it (the step queued while the interval's totals were read), then save a checkpoint and exit."""

    def __init__(self) -> None:
        self.requested = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)
        watch_supervisor(self._agent_gone)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def _agent_gone(self, agent_pid: int) -> None:
        """The agent (torchrun) that would have stopped this rank is gone: stop as on SIGTERM, and since nothing
        will kill this rank if it cannot (a peer that died mid-collective), leave after the grace period."""
        rank, grace = os.environ.get("RANK", "0"), stop_grace()
        print(
            f"trainstack rank {rank}: its agent (PID {agent_pid}) is gone; stopping at the next log interval with "
            f"a checkpoint",
            file=sys.stderr,
            flush=True,
        )
        self.requested = True
        time.sleep(grace)
        print(
            f"trainstack rank {rank}: did not stop within {grace:g} s of its agent's end ({STOP_GRACE_ENV}); "
            "exiting without a checkpoint",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_FAILED)
