"""Where a rank's wall time goes besides its steps (trainstack/breakdown.py), interval by interval: the startup from
the launch to the first step, the pauses the loop reports, and the steps that compiled. Each part's seconds go to
its series as it ends (`spent`), and into the interval's record at its cut."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainstack import breakdown


@dataclass(frozen=True)
class NotStepping:
    """An interval's time outside its steps, taken at its cut."""

    step_count: int  # optimizer steps, those that compiled included
    compile_seconds: float  # of the steps that compiled
    paused: list[dict]  # the pauses (and the startup) that ended in it: {"part", "seconds", "after_steps"}
    spans: list[tuple[float, float]]  # unix-time spans of the startup, pauses and compiling steps


class WallTime:
    def __init__(self, launched_at: float, spent: Callable[[str, float], None]):
        """`launched_at`: unix time the rank's launch began (records_file.py's launch_time); `spent`: puts a part's
        seconds into its series."""
        self._launched_at = launched_at
        self._spent = spent
        self._starting = True  # no step yet
        self._paused_while_starting = 0.0
        self._step_count = 0
        self._compile_seconds = 0.0
        self._paused: list[dict] = []
        self._spans: list[tuple[float, float]] = []

    def stepped(self, clock_started_at: float) -> None:
        """A step ended; the first ends the startup at `clock_started_at`, when its clock started (unix time)."""
        if self._starting:
            self._end_startup(clock_started_at)
        self._step_count += 1

    def compiled(self, seconds: float, ended_at: float) -> None:
        """The step just counted compiled for `seconds`, until `ended_at`: compile time, not a step time."""
        self._compile_seconds += seconds
        self._spans.append((ended_at - seconds, ended_at))
        self._spent(breakdown.COMPILE, seconds)

    def paused(self, part: str, seconds: float, started_at: float) -> None:
        """The pause `part`, begun at `started_at` (unix time), lasted `seconds`."""
        if self._starting:
            self._paused_while_starting += seconds
        self._not_training(part, seconds, (started_at, started_at + seconds))

    def cut(self) -> NotStepping:
        """The interval's time outside its steps; the next interval's starts."""
        cut = NotStepping(self._step_count, self._compile_seconds, self._paused, self._spans)
        self._step_count, self._compile_seconds, self._paused, self._spans = 0, 0.0, [], []
        return cut

    def ended(self, at: float) -> NotStepping:
        """The rank exits at `at`: a rank that never stepped spent all its time starting. What the closing line
        says: the steps and pauses since the last cut."""
        if self._starting:
            self._end_startup(at)
        return self.cut()

    def _not_training(self, part: str, seconds: float, span: tuple[float, float]) -> None:
        """A pause or the startup: into this interval's record, after the steps counted so far."""
        self._paused.append({"part": part, "seconds": seconds, "after_steps": self._step_count})
        self._spans.append(span)
        self._spent(part, seconds)

    def _end_startup(self, at: float) -> None:
        """Startup runs from the launch to `at`, the start of the first step's clock, less the pauses before it."""
        self._starting = False
        self._not_training(
            breakdown.STARTUP, max(0.0, at - self._launched_at - self._paused_while_starting), (self._launched_at, at)
        )
