"""The exporter's own metrics: is NVML up, how NVML calls fail, how old the GPU sample is and what sampling costs,
how long and how well each collector ran."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from monitoring.exporter.nvml import NvmlSession
from monitoring.exporter.sampler import CADENCES, Sampler

log = logging.getLogger(__name__)


class Collector(Protocol):
    """What every collector is: a name for the self-metrics and metric families built fresh at each call."""

    name: str

    def collect(self) -> Iterator[Metric]: ...


class CollectorRuns:
    """Duration and outcome of each collector's latest run, for trainstack_exporter_collector_*."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, bool]] = {}

    def record(self, name: str, seconds: float, succeeded: bool) -> None:
        with self._lock:
            self._latest[name] = (seconds, succeeded)

    def latest(self) -> dict[str, tuple[float, bool]]:
        with self._lock:
            return dict(self._latest)


class Timed:
    """Runs a collector, times it, and keeps a failing collector from failing the whole scrape."""

    def __init__(self, collector: Collector, runs: CollectorRuns):
        self._collector = collector
        self._runs = runs

    def collect(self) -> list[Metric]:
        start = time.perf_counter()
        try:
            families = list(self._collector.collect())
        except Exception:  # e.g. a metrics file half-written by a rank: serve the rest
            log.exception("collector %s failed; its metrics are left out of this scrape", self._collector.name)
            families, succeeded = [], False
        else:
            succeeded = True
        self._runs.record(self._collector.name, time.perf_counter() - start, succeeded)
        return families


class ExporterCollector:
    name = "exporter"

    def __init__(self, session: NvmlSession, runs: CollectorRuns, sampler: Sampler):
        self._session = session
        self._runs = runs
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        health = self._session.health()
        yield GaugeMetricFamily("trainstack_exporter_nvml_up",
                                "1 when NVML initialised (a driver is present), else 0.", value=float(health.up))
        yield GaugeMetricFamily("trainstack_exporter_gpus_lost",
                                "GPUs that answered NVMLError_GpuIsLost and dropped out (need a reset).",
                                value=health.gpus_lost)
        errors = CounterMetricFamily("trainstack_exporter_nvml_errors",
                                     "Failed NVML calls by call and error (NotSupported: counted once, then "
                                     "the field is omitted).", labels=["call", "error"])
        for (call, error), count in sorted(health.errors.items()):
            errors.add_metric([call, error], count)
        if errors.samples:
            yield errors
        if health.up:
            yield from self._sampling()
        durations = GaugeMetricFamily("trainstack_exporter_collector_duration_seconds",
                                      "Time the collector took in its latest run.", labels=["collector"])
        successes = GaugeMetricFamily("trainstack_exporter_collector_success",
                                      "1 when the collector's latest run succeeded, else 0.", labels=["collector"])
        for name, (seconds, succeeded) in sorted(self._runs.latest().items()):
            durations.add_metric([name], seconds)
            successes.add_metric([name], float(succeeded))
        if durations.samples:
            yield durations
            yield successes

    def _sampling(self) -> Iterator[Metric]:
        labels = ["cadence"]
        age = GaugeMetricFamily("trainstack_exporter_gpu_sample_age_seconds",
                                "Time since the GPU sample served started: fast, every GPU metric; slow, the "
                                "counters and slow sensors read at the slow cadence (docs/metrics.md).", labels=labels)
        for cadence, seconds in sorted(self._sampler.ages().items()):
            age.add_metric([cadence], seconds)
        interval = GaugeMetricFamily("trainstack_exporter_gpu_sample_interval_seconds",
                                     "How often the sampler reads that part of the GPU sample (its flag).",
                                     labels=labels)
        interval.add_metric(["fast"], self._sampler.interval_seconds)
        interval.add_metric(["slow"], self._sampler.slow_interval_seconds)
        cost = self._sampler.cost()
        samples = CounterMetricFamily("trainstack_exporter_gpu_samples",
                                      "GPU samples taken, by cadence (a slow sample reads both parts).",
                                      labels=labels)
        cpu = CounterMetricFamily("trainstack_exporter_gpu_sample_cpu_seconds",
                                  "CPU time the GPU sampler spent in samples of that cadence.", labels=labels)
        duration = GaugeMetricFamily("trainstack_exporter_gpu_sample_duration_seconds",
                                     "Wall time the latest GPU sample of that cadence took.", labels=labels)
        for cadence in CADENCES:
            samples.add_metric([cadence], cost.samples[cadence])
            cpu.add_metric([cadence], cost.cpu_seconds[cadence])
            duration.add_metric([cadence], cost.latest_seconds[cadence])
        yield from (family for family in (age, interval, samples, cpu, duration) if family.samples)
