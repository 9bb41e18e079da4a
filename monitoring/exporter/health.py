"""The exporter's own metrics: is NVML up, how NVML calls fail, how old the GPU sample is and what sampling costs,
how long and how well each collector ran."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainstack import catalog
from trainstack.monitoring.exporter.nvml import NvmlSession
from trainstack.monitoring.exporter.sampler import CADENCES, Sampler

log = logging.getLogger(__name__)


class CollectorRuns:
    """Duration and outcome of each collector's latest run, for the exporter's collector metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, bool]] = {}

    def record(self, name: str, seconds: float, succeeded: bool) -> None:
        with self._lock:
            self._latest[name] = (seconds, succeeded)

    def latest(self) -> dict[str, tuple[float, bool]]:
        with self._lock:
            return dict(self._latest)


class NamedCollector(Protocol):
    """A collector with the name its self-metrics carry (`gpu`, `training`, ...)."""

    name: str

    def collect(self) -> Iterable[Metric]: ...


class Timed(Collector):
    """Runs a collector (one with a `name` for the self-metrics), times it, and keeps a failing collector from
    failing the whole scrape."""

    def __init__(self, collector: NamedCollector, runs: CollectorRuns):
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


class ExporterCollector(Collector):
    name = "exporter"

    def __init__(self, session: NvmlSession, runs: CollectorRuns, sampler: Sampler):
        self._session = session
        self._runs = runs
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        health = self._session.health()
        yield catalog.family(catalog.EXPORTER_NVML_UP, value=float(health.up))
        yield catalog.family(catalog.EXPORTER_GPUS_LOST, value=health.gpus_lost)
        errors = catalog.family(catalog.EXPORTER_NVML_ERRORS)
        for (call, error), count in sorted(health.errors.items()):
            errors.add_metric([call, error], count)
        if errors.samples:
            yield errors
        if health.up:
            yield from self._sampling()
        durations = catalog.family(catalog.EXPORTER_COLLECTOR_DURATION)
        successes = catalog.family(catalog.EXPORTER_COLLECTOR_SUCCESS)
        for name, (seconds, succeeded) in sorted(self._runs.latest().items()):
            durations.add_metric([name], seconds)
            successes.add_metric([name], float(succeeded))
        if durations.samples:
            yield durations
            yield successes

    def _sampling(self) -> Iterator[Metric]:
        age = catalog.family(catalog.EXPORTER_GPU_SAMPLE_AGE)
        for cadence, seconds in sorted(self._sampler.ages().items()):
            age.add_metric([cadence], seconds)
        interval = catalog.family(catalog.EXPORTER_GPU_SAMPLE_INTERVAL)
        interval.add_metric(["fast"], self._sampler.interval_seconds)
        interval.add_metric(["slow"], self._sampler.slow_interval_seconds)
        cost = self._sampler.cost()
        samples = catalog.family(catalog.EXPORTER_GPU_SAMPLES)
        cpu = catalog.family(catalog.EXPORTER_GPU_SAMPLE_CPU)
        duration = catalog.family(catalog.EXPORTER_GPU_SAMPLE_DURATION)
        for cadence in CADENCES:
            samples.add_metric([cadence], cost.samples[cadence])
            cpu.add_metric([cadence], cost.cpu_seconds[cadence])
            duration.add_metric([cadence], cost.latest_seconds[cadence])
        yield from (family for family in (age, interval, samples, cpu, duration) if family.samples)
