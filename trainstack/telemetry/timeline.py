"""Step, forward and data-wait times on a device's own clock, from timing events read once per log interval: what
the marks of a GPU rank's clock (clock.py, `GpuRankClock`) measure, and how an interval's marks are read.

On a GPU the host runs ahead: it queues a step's kernels and moves on, so its clock says when work was queued,
not when it ran. A host blocked in the loader's `next()` while the GPU still works through the previous steps
is no loss; what costs throughput is the GPU running out of queued work. So the loop marks the stream when the
host starts waiting for a batch and again once it has the batch (Accelerate copies it to the device inside
`next()`): on the GPU's timeline the first mark runs when the work queued before it is done and the second when
the host got past `next()`, so the gap between them is the time the GPU sat idle for want of a batch, and zero
when it still had work. An interval's events are read when the loop reads its loss totals, after it has queued
the next step, so no step waits on this. The events come from a small pool: the loop marks a handful per step.

Anything with torch.cuda.Event's `record()`, `elapsed_time(end)` (milliseconds) and `synchronize()` will do,
which is how the tests drive this with a fake GPU clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TimingEvent(Protocol):
    def record(self) -> None: ...

    def elapsed_time(self, end: TimingEvent) -> float:
        """Milliseconds from this event to `end`, on the device's clock; both must have run."""

    def synchronize(self) -> None:
        """Wait until the device has reached this event."""


@dataclass(frozen=True)
class IntervalTimes:
    data_wait_seconds: float
    """Device idle time while the host waited for batches (starvation)."""
    step_seconds: list[float]
    """Each optimizer step's duration, end of the previous step (or of a pause) to the end of this one."""
    forward_seconds: float


Span = tuple[TimingEvent, TimingEvent]


class IntervalSpans:
    """One interval's marks, until they are read; then their events go back to the timeline's pool."""

    def __init__(
        self,
        waits: list[Span],
        forwards: list[Span],
        steps: list[Span],
        last_step_end: TimingEvent,
        pool: list[TimingEvent],
    ):
        self._waits, self._forwards, self._steps = waits, forwards, steps
        self._last_step_end = last_step_end  # the interval's last mark, and where the next interval's first step starts
        self._pool = pool

    def times(self) -> IntervalTimes:
        """Waits until the device has reached the interval's last mark: called once the loop has queued the next
        step, that wait leaves the device working; called at once, it drains the queue."""
        self._last_step_end.synchronize()

        def seconds(spans: list[Span]) -> list[float]:
            return [start.elapsed_time(end) / 1000 for start, end in spans]

        times = IntervalTimes(sum(seconds(self._waits)), seconds(self._steps), sum(seconds(self._forwards)))
        used = {id(event): event for span in (*self._waits, *self._forwards, *self._steps) for event in span}
        used.pop(id(self._last_step_end), None)  # still in use: the next interval reads it as a step's start
        self._pool.extend(used.values())
        return times
