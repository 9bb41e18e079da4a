"""The GPU sampler: NVML is read on a thread of its own, at its own cadence; a scrape renders the latest snapshot.

A scrape never calls NVML, so its cost does not grow with the number of GPUs, and a hung or slow NVML call ages the
snapshot (the exporter's GPU sample age metric) instead of hanging the scrape (the anchors: dcgm-exporter
serves DCGM's cached samples; nvidia_gpu_exporter moved to a collect interval with a cached snapshot after scrape
hangs). Each sample reads the fast part of every GPU; every `slow_interval_seconds` a sample also reads the slow part
(monitoring/exporter/nvml.py). Between slow reads a snapshot carries the slow values of the last slow read as NVML
returned them: a counter keeps its last exact value, never one NVML did not answer.

The snapshot is a frozen object replaced whole, so a scrape reads one consistent sample without a lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainstack.monitoring.exporter.nvml import SLOW_ATTRIBUTES, Gpu, GpuSample, NvmlSession

log = logging.getLogger(__name__)
CADENCES = ("fast", "slow")


@dataclass(frozen=True)
class GpuSnapshot:
    """The GPUs at the latest sample. Times are on the sampler's clock (monotonic seconds); None: not sampled yet."""

    up: bool
    driver_version: str
    gpus: tuple[Gpu, ...] = ()
    samples: tuple[GpuSample, ...] = ()
    xid_errors: dict[tuple[int, str, int], int] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    """pid -> name of every process on a GPU in the samples ("" where NVML cannot tell)."""
    sampled_at: dict[str, float] = field(default_factory=dict)
    """cadence -> when the latest sample that read that part started."""


@dataclass(frozen=True)
class SamplerCost:
    """What sampling has cost since the exporter started, by cadence: a slow sample reads both parts."""

    samples: dict[str, int]
    cpu_seconds: dict[str, float]
    """CPU time of the sampling thread, measured around each sample (time.thread_time)."""
    latest_seconds: dict[str, float]
    """Wall time the latest sample of that cadence took."""


class Sampler:
    def __init__(
        self,
        session: NvmlSession,
        interval_seconds: float,
        slow_interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.session = session
        self.interval_seconds = interval_seconds
        self.slow_interval_seconds = slow_interval_seconds
        self.clock = clock
        self._snapshot = GpuSnapshot(session.up, session.driver_version)
        self._slow_values: dict[int, dict[str, float | None]] = {}
        self._samples = dict.fromkeys(CADENCES, 0)
        self._cpu_seconds = dict.fromkeys(CADENCES, 0.0)
        self._latest_seconds = dict.fromkeys(CADENCES, 0.0)
        self._sampling = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="exporter-gpu-sampler", daemon=True)

    def snapshot(self) -> GpuSnapshot:
        return self._snapshot

    def cost(self) -> SamplerCost:
        return SamplerCost(dict(self._samples), dict(self._cpu_seconds), dict(self._latest_seconds))

    def ages(self) -> dict[str, float]:
        """cadence -> seconds since the latest sample of that cadence started; empty before the first sample."""
        now = self.clock()
        return {cadence: now - at for cadence, at in self._snapshot.sampled_at.items()}

    def sample_now(self, slow: bool | None = None) -> GpuSnapshot:
        """Take one sample and publish it; `slow`: read the slow part too (None: when it is due). The sampler's
        thread calls this on its cadence; tests call it directly to drive the sampler without sleeping."""
        with self._sampling:
            started, cpu = self.clock(), time.thread_time()
            previous = self._snapshot
            if slow is None:
                last_slow = previous.sampled_at.get("slow")
                # Half a fast interval of slack: a tick that comes a little early still reads the slow part.
                slow = (
                    last_slow is None or started - last_slow >= self.slow_interval_seconds - self.interval_seconds / 2
                )
            reading = self.session.read(slow=slow)
            samples = tuple(self._with_slow_values(sample, slow) for sample in reading.samples)
            sampled_at = {**previous.sampled_at, "fast": started} | ({"slow": started} if slow else {})
            self._snapshot = GpuSnapshot(
                reading.up,
                reading.driver_version,
                tuple(reading.gpus),
                samples,
                reading.xid_errors,
                reading.process_names,
                sampled_at,
            )
            cadence = "slow" if slow else "fast"
            self._samples[cadence] += 1
            self._cpu_seconds[cadence] += time.thread_time() - cpu
            self._latest_seconds[cadence] = self.clock() - started
            return self._snapshot

    def _with_slow_values(self, sample: GpuSample, slow: bool) -> GpuSample:
        """The sample, which is not published yet, with the slow values of the latest slow read."""
        if slow:
            self._slow_values[sample.index] = {name: getattr(sample, name) for name in SLOW_ATTRIBUTES}
        else:
            for name, value in self._slow_values.get(sample.index, {}).items():
                setattr(sample, name, value)
        return sample

    def start(self) -> None:
        """The first sample now, so the endpoint never serves an empty one; then the thread, where NVML is up."""
        self.sample_now(slow=True)
        if self.session.up:
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """A thread stuck in a hung NVML call cannot be interrupted; it is a daemon and ends with the process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        due = self.clock()
        while True:
            due += self.interval_seconds
            late = self.clock() - due
            if late > 0:  # a sample overran its interval (a slow driver): skip the ticks it missed
                due += math.ceil(late / self.interval_seconds) * self.interval_seconds
            if self._stop.wait(due - self.clock()):
                return
            try:
                self.sample_now()
            except Exception:  # NvmlSession never raises for NVML; anything else must not end the sampling
                log.exception("GPU sample failed; the previous one is served until the next succeeds")
