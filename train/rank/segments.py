"""A run's segments: one entry per launch that trained it, carried in every checkpoint and written to summary.json.

A run stopped and resumed (SIGTERM, a crash, a lost node) is trained in segments. Each checkpoint carries the
segments so far, the current one up to that checkpoint, so a resumed run knows them all, including those of
launches that were killed and never wrote a summary (their steps after the last checkpoint were trained again
and are not counted). Throughput is over all segments: their samples and tokens over their training seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from trainstack.rundir import Segment

SEGMENTS_KEY: Final = "segments"
INTERRUPTED = "interrupted"  # the launch ended after this checkpoint without saving again: killed or failed


class RunRecord:
    """The segments restored from the checkpoint this launch resumed, plus the one it trains now."""

    def __init__(
        self,
        run_id: str,
        progress,
        restored: list[Segment] | None = None,
        not_training: Callable[[], float] = lambda: 0.0,
    ):
        self.previous: list[Segment] = [
            {**segment, "exit_reason": segment.get("exit_reason") or INTERRUPTED} for segment in restored or []
        ]
        self.run_id = run_id
        self.started = time.time()
        self.first_step, self.first_samples, self.first_tokens = progress.step, progress.samples, progress.tokens
        self.loop_started: float | None = None
        self.loop_seconds: float | None = None  # set when the loop ends; until then it is measured up to now
        self.exit_reason: str | None = None
        self._not_training = not_training  # seconds of the loop that trained nothing (compiling)

    def loop_begins(self) -> None:
        self.loop_started = time.time()

    def loop_ends(self, exit_reason: str) -> None:
        assert self.loop_started is not None, "loop_ends without loop_begins"
        self.loop_seconds = time.time() - self.loop_started - self._not_training()
        self.exit_reason = exit_reason

    def segments(self, progress, exit_reason: str | None = None) -> list[Segment]:
        if self.loop_seconds is not None:
            seconds = self.loop_seconds
        else:
            seconds = time.time() - self.loop_started - self._not_training() if self.loop_started else 0.0
        current: Segment = {
            "run_id": self.run_id,
            "started": self.started,
            "ended": time.time(),
            "first_step": self.first_step,
            "last_step": progress.step,
            "samples": progress.samples - self.first_samples,
            "tokens": progress.tokens - self.first_tokens,
            "train_seconds": seconds,
            "exit_reason": exit_reason or self.exit_reason,
        }
        return [*self.previous, current]

    def throughput(self, progress) -> dict[str, float]:
        segments = self.segments(progress)
        seconds = max(sum(s["train_seconds"] for s in segments), 1e-9)
        return {
            "samples_per_second": sum(s["samples"] for s in segments) / seconds,
            "tokens_per_second": sum(s["tokens"] for s in segments) / seconds,
        }
