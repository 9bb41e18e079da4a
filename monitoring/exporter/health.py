"""The exporter's own metrics: is NVML up, how NVML calls fail, how long and how well each collector ran."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from monitoring.exporter.nvml import NvmlSession

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

    def __init__(self, session: NvmlSession, runs: CollectorRuns):
        self._session = session
        self._runs = runs

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
