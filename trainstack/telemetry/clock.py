"""The clock a rank measures its step, forward and data-wait times on: one strategy, chosen from its device once,
when its monitor is built (`clock_for`), and called the same way at every mark after that (trainstack/monitor.py).

- A CPU rank's is the host's: a wait for data, a forward pass or a step lasts what the host's clock says, known
  and published at once.
- A GPU rank's is the GPU's own timeline of CUDA events (timeline.py), since the host's clock there says when work
  was queued, not when it ran: an interval's times are known, and published, once the device has run it. NVML also
  says how busy the GPU was (gpu_busy.py, gpu_activity.py): record fields a CPU rank's records lack.

Either gives the communication timer its marks on the same clock (comm_timer.py).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from trainstack.telemetry.comm_timer import Clock, DeviceClock, HostClock
from trainstack.telemetry.gpu_activity import GpuActivity
from trainstack.telemetry.gpu_busy import GpuBusy
from trainstack.telemetry.metrics import RankMetrics
from trainstack.telemetry.timeline import IntervalSpans, IntervalTimes, Span, TimingEvent


class PendingTimes(ABC):
    """An interval's times, from its cut until the telemetry records it."""

    @abstractmethod
    def read(self) -> tuple[IntervalTimes, float]:
        """The times, and the unix time the interval's last step ended."""


class RankClock(ABC):
    name: ClassVar[str]
    """The records' and the run-info series' `clock`: "host" or "gpu"."""
    marks: Clock
    """The communication timer's marks, on this clock."""
    measures_busy: bool
    """Whether it says how busy the device was while it stepped, which host-bound idle is measured from."""

    @classmethod
    @abstractmethod
    def start(cls, uuid: str, metrics: RankMetrics) -> RankClock:
        """The clock of the rank on device `uuid` (NVML's name of a GPU), its first step starting now; it
        publishes the data-wait and step times into `metrics` once it knows them."""

    @abstractmethod
    def data_wait_started(self) -> None:
        """The loop is about to ask the loader for the next batch."""

    @abstractmethod
    def data_ready(self, host_seconds: float) -> None:
        """The loader answered after `host_seconds` on the host's clock."""

    @abstractmethod
    def forward_started(self) -> None: ...

    @abstractmethod
    def forward_done(self) -> None: ...

    @abstractmethod
    def step_done(self) -> None: ...

    @abstractmethod
    def wait_for_device(self) -> None:
        """Returns once the device has run everything queued so far (a pause starts there)."""

    @abstractmethod
    def restart_step_clock(self) -> None:
        """After a pause: that pause is not a step, so the next step starts now."""

    @abstractmethod
    def cut(self) -> PendingTimes:
        """Ends the interval at the end of a step; the next one starts with the next mark."""

    @abstractmethod
    def busy_share(self, start: float, end: float, not_stepping: list[tuple[float, float]]) -> float | None:
        """The share of the time between `start` and `end` (unix seconds), outside `not_stepping`, in which the
        device ran a kernel; None where unmeasured."""

    @abstractmethod
    def activity(self) -> dict[str, float]:
        """The record fields for what the device did since the last call (gpu_activity.py): {} where unmeasured."""

    @abstractmethod
    def close(self) -> None: ...


def clock_for(device: torch.device) -> type[RankClock]:
    return GpuRankClock if device.type == "cuda" else HostRankClock


@dataclass(frozen=True)
class KnownTimes(PendingTimes):
    """The host's: known, and its last step ended, at the cut."""

    times: IntervalTimes
    ended: float

    def read(self) -> tuple[IntervalTimes, float]:
        return self.times, self.ended


class HostRankClock(RankClock):
    """A CPU rank's: the host's clock, which runs with its work."""

    name = "host"
    measures_busy = False

    def __init__(self, metrics: RankMetrics):
        self.marks = HostClock()
        self._metrics = metrics
        self._last_step_end = time.perf_counter()
        self._step_seconds: list[float] = []
        self._data_wait = 0.0
        self._forward_start = 0.0
        self._forward_seconds = 0.0

    @classmethod
    def start(cls, uuid: str, metrics: RankMetrics) -> HostRankClock:
        return cls(metrics)

    def data_wait_started(self) -> None:
        pass  # the telemetry times the host's wait, and data_ready hands it over

    def data_ready(self, host_seconds: float) -> None:
        self._data_wait += host_seconds
        self._metrics.data_wait.inc(host_seconds)

    def forward_started(self) -> None:
        self._forward_start = time.perf_counter()

    def forward_done(self) -> None:
        self._forward_seconds += time.perf_counter() - self._forward_start

    def step_done(self) -> None:
        now = time.perf_counter()
        duration = now - self._last_step_end
        self._last_step_end = now
        self._step_seconds.append(duration)
        self._metrics.step_duration.observe(duration)

    def wait_for_device(self) -> None:
        pass  # the host has run its work by the time it gets here

    def restart_step_clock(self) -> None:
        self._last_step_end = time.perf_counter()

    def cut(self) -> KnownTimes:
        times = KnownTimes(IntervalTimes(self._data_wait, self._step_seconds, self._forward_seconds), time.time())
        self._step_seconds, self._data_wait, self._forward_seconds = [], 0.0, 0.0
        return times

    def busy_share(self, start: float, end: float, not_stepping: list[tuple[float, float]]) -> float | None:
        return None

    def activity(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class DeviceTimes(PendingTimes):
    """The GPU's: the interval's CUDA events, read once the device has run them."""

    def __init__(self, spans: IntervalSpans, metrics: RankMetrics):
        self._spans = spans
        self._metrics = metrics

    def read(self) -> tuple[IntervalTimes, float]:
        """Waits, if need be, until the device has run the interval (timeline.py)."""
        times = self._spans.times()
        # The device has just run the interval's last step: the host's clock at the cut said only when that step was
        # queued.
        ended = time.time()
        self._metrics.data_wait.inc(times.data_wait_seconds)
        for duration in times.step_seconds:
            self._metrics.step_duration.observe(duration)
        return times, ended


class GpuRankClock(RankClock):
    """A GPU rank's: CUDA events on the device's timeline (timeline.py says why each mark is where it is), and
    NVML's samples of how busy it was. The events come from a small pool: the loop marks a handful per step."""

    name = "gpu"

    def __init__(
        self,
        new_event: Callable[[], TimingEvent],
        metrics: RankMetrics,
        busy: GpuBusy | None,
        activity: GpuActivity | None,
    ):
        """`new_event`: torch.cuda.Event's, or a fake GPU's in the tests; `busy`, `activity`: None where NVML cannot
        answer for this GPU."""
        self._new_event = new_event
        self._free: list[TimingEvent] = []
        self._step_start = self._mark()
        self._open: TimingEvent | None = None
        self._waits: list[Span] = []
        self._forwards: list[Span] = []
        self._steps: list[Span] = []
        self.marks = DeviceClock(new_event)
        self._metrics = metrics
        self._busy = busy
        self._activity = activity
        self.measures_busy = busy is not None

    @classmethod
    def start(cls, uuid: str, metrics: RankMetrics) -> GpuRankClock:
        return cls(partial(torch.cuda.Event, enable_timing=True), metrics, GpuBusy.open(uuid), GpuActivity.open(uuid))

    def _mark(self) -> TimingEvent:
        event = self._free.pop() if self._free else self._new_event()
        event.record()
        return event

    def _open_span(self) -> None:
        self._open = self._mark()

    def _close_span(self, spans: list[Span]) -> None:
        assert self._open is not None, "a span closes only after _open_span"
        spans.append((self._open, self._mark()))
        self._open = None

    def data_wait_started(self) -> None:
        self._open_span()

    def data_ready(self, host_seconds: float) -> None:
        self._close_span(self._waits)  # the GPU's starvation, not the host's wait

    def forward_started(self) -> None:
        self._open_span()

    def forward_done(self) -> None:
        self._close_span(self._forwards)

    def step_done(self) -> None:
        end = self._mark()
        self._steps.append((self._step_start, end))
        self._step_start = end

    def wait_for_device(self) -> None:
        mark = self._mark()
        mark.synchronize()
        self._free.append(mark)

    def restart_step_clock(self) -> None:
        self._step_start = self._mark()

    def cut(self) -> DeviceTimes:
        """No wait or forward pass is half-marked at the end of a step. The interval's times are read later, once
        the device has run its marks."""
        spans = IntervalSpans(self._waits, self._forwards, self._steps, self._step_start, self._free)
        self._waits, self._forwards, self._steps = [], [], []
        return DeviceTimes(spans, self._metrics)

    def busy_share(self, start: float, end: float, not_stepping: list[tuple[float, float]]) -> float | None:
        return self._busy.share(start, end, not_stepping) if self._busy else None

    def activity(self) -> dict[str, float]:
        return self._activity.read() if self._activity else {}

    def close(self) -> None:
        if self._busy:
            self._busy.close()
        if self._activity:
            self._activity.close()
