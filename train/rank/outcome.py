"""How a rank's run ends: its exit code, one line on a failure, and summary.json (written by the main process).

A failure's exit code is decided where the failure is recognised (`explain_runtime_error` returns it with the
message), never read back from the message's wording.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainstack.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from trainstack.rundir import FAILURE_NOTES_ENV, METRICS_DIR_ENV, FailureNote, Segment, Summary
from trainstack.train.rank.config import TrainConfig
from trainstack.train.rank.segments import SEGMENTS_KEY
from trainstack.write_failure import WriteFailure

EXIT_CODES = {"completed": EXIT_OK, "preempted": EXIT_PREEMPTED}  # the loop's exit reasons


# A peer's process went away under a collective: gloo's socket closed or reset, NCCL's remote error.
PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exit")
PEER_LOST_EXIT_DELAY_SECONDS = 1.0
"""How long a rank that only lost its peer waits before it exits. torchrun reports the rank it sees end first,
polling every 0.1 s, and a rank forked from the agent is reported alone: torch's multiprocessing takes the first
ended process in rank order, not in time. A peer killed outright (SIGKILL, the OOM killer) leaves no note, and on a
quick host the rank that lost it used to exit within the same poll; rank 0 was then reported and named in its place
(train/launcher/agent.py, first_failure). Waiting lets the rank that stopped first be seen first."""


@dataclass(frozen=True)
class Failure:
    message: str  # one line: what went wrong and what to do about it
    exit_code: int  # EXIT_CONFIG when changing the input fixes it, EXIT_RUNTIME for I/O, EXIT_FAILED otherwise
    peer_lost: bool = False  # this rank only saw another one go away, or was ended with it: it is not the cause


# torch's DataLoader, when a worker process dies of a signal (here SIGTERM): "DataLoader worker (pid N) is killed
# by signal: Terminated."
WORKER_TERMINATED = "is killed by signal: terminated"


def explain_runtime_error(error: RuntimeError, config: TrainConfig, stopping: bool = False) -> Failure | None:
    """Turn the distributed failures users meet into what to do about them; None means a genuine bug. stopping:
    this rank has been sent SIGTERM (or SIGINT)."""
    text = str(error)
    if stopping and WORKER_TERMINATED in text.lower():
        # torchrun ends the ranks that remain after one fails with SIGTERM to each rank's process group: the
        # loader workers die of it at once, and torch raises that in the rank before it can reach its stop.
        return Failure(
            "ended by the SIGTERM that stops every rank once one has failed, with its loader workers; the "
            "launcher's last line names the rank that failed and its error",
            EXIT_FAILED,
            peer_lost=True,
        )
    if "find_unused_parameters" in text or "did not receive grad" in text:
        return Failure(
            "some model parameters received no gradient in this step, which DDP cannot reduce; set "
            "find_unused_parameters = true (--find-unused-parameters) or remove the unused parameters "
            "from the model",
            EXIT_CONFIG,
        )
    lowered = text.lower()
    if any(sign in lowered for sign in PEER_LOST):
        # The peer's socket closed: it exited (or was killed) a moment ago; nothing waited for a timeout.
        return Failure(
            "lost the connection to a peer rank, which stopped first; the launcher's last line names "
            "the rank that failed and its error",
            EXIT_FAILED,
            peer_lost=True,
        )
    if "timed out" in lowered or "timeout" in lowered:
        from trainstack.metric_files import progress_by_rank  # not at the top: see catalog.rank_metric

        me = str(int(os.environ.get("RANK", "0")))
        # This rank timed out waiting, so it is not the one that stopped: of the others, the one with the
        # fewest completed steps, then forward passes, then the oldest last step.
        peers = {r: p for r, p in progress_by_rank(os.environ.get(METRICS_DIR_ENV)).items() if r != me}
        culprit = ""
        if peers:
            rank, (steps, forwards, last) = min(peers.items(), key=lambda item: item[1])
            culprit = (
                f"; rank {rank} stopped first (last step {int(steps)}, {time.time() - last:.0f} s ago): "
                "it is hung or died, see its log"
            )
        return Failure(
            f"a collective waited longer than --collective-timeout {config.collective_timeout:g} s for "
            f"a peer rank{culprit}",
            EXIT_FAILED,
        )
    return None


def report_failure(rank: int, failure: Failure) -> None:
    """One line on stderr, and the same in a `FailureNote` for the agent, which names the rank that failed first
    and why (train/launcher/agent.py). The notes' folder is not the run directory, so a full or read-only run
    directory does not lose it; if it cannot be written, the line on stderr remains."""
    print(f"trainstack rank {rank}: error: {failure.message}", file=sys.stderr, flush=True)
    folder = os.environ.get(FAILURE_NOTES_ENV)
    if not folder:
        return  # not started by trainstack's agent
    note = FailureNote(rank, failure.message, failure.exit_code, failure.peer_lost, time.time())
    try:
        note.write(Path(folder))
    except (OSError, WriteFailure):
        pass


def summary(
    accelerator,
    config: TrainConfig,
    progress,
    *,
    run_id: str,
    started: float,
    throughput: dict[str, float],
    compile_watch,
    segments: list[Segment],
    exit_reason: str,
    exit_code: int,
    eval_loss: float | None,
    error: str | None,
) -> Summary:
    """summary.json's fields (docs/training.md, Exit codes)."""
    p = progress
    return {
        "run_id": run_id,
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "device": str(accelerator.device.type),
        "mixed_precision": config.mixed_precision,
        "model": config.model,
        "dataset": config.dataset,
        "steps": p.step,
        "epochs": p.epoch + (p.batch_in_epoch > 0),
        "initial_loss": p.initial_loss,
        "final_loss": p.last_loss,
        "eval_loss": eval_loss,
        "evaluations": p.evaluations,
        "samples_per_second": throughput.get("samples_per_second"),  # over all segments
        "tokens_per_second": throughput.get("tokens_per_second"),
        "compile_seconds": compile_watch.seconds,
        "recompiles": compile_watch.recompiles,
        "wall_seconds": time.time() - started,
        "resumed_from": p.resumed_from,
        "exit_reason": exit_reason,
        "exit_code": exit_code,
        "error": error,
        SEGMENTS_KEY: segments,
    }
