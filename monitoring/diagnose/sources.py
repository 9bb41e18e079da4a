"""Where diagnose reads metrics: a live exporter (two scrapes some seconds apart give the rates) or a Prometheus
server (instant queries, rates over the recording rules' 2m window). Both answer the same two questions, so
the diagnosis does not care which it reads."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from trainstack import catalog, ratios
from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring.exporter.gpu import COUNTERS
from trainstack.monitoring.exporter.nvml import SLOW_ATTRIBUTES
from trainstack.rundir import DEFAULT_EXPORTER_HOST, DEFAULT_EXPORTER_PORT

Sample = tuple[dict[str, str], float]
PROMETHEUS_WINDOW = ratios.WINDOW  # the recording rules' window
GPU_SAMPLE_AGE = catalog.EXPORTER_GPU_SAMPLE_AGE.name
GPU_SAMPLE_INTERVAL = catalog.EXPORTER_GPU_SAMPLE_INTERVAL.name
GPU_SAMPLES = catalog.EXPORTER_GPU_SAMPLES.name
# The exporter reads these at its slow cadence (docs/metrics.md): between two of its reads they do not move.
SLOW_GPU_COUNTERS = frozenset(metric.name for attribute, metric in COUNTERS.items() if attribute in SLOW_ATTRIBUTES)


class Source(Protocol):
    description: str
    now: float
    """Unix time of the newest reading, on the source's clock (Prometheus) or this host's (exporter)."""
    ended_meanwhile: str
    """A note when the run ended while it was read (its exporter went away between two scrapes); else ""."""

    def instant(self, name: str) -> list[Sample]:
        """The newest value of every series of a sample name (a counter's name ends in _total)."""

    def rate(self, name: str) -> list[Sample]:
        """Per-second increase of every series of a counter sample name over the source's window."""


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RuntimeFailure(
            f"cannot read {url} ({reason}); is the run going? The launcher's exporter listens on "
            f"{DEFAULT_EXPORTER_HOST}:{DEFAULT_EXPORTER_PORT} unless --exporter-port says "
            "otherwise: pass its address to --url"
        ) from None


class ExporterSource:
    def __init__(
        self,
        url: str,
        interval: float,
        timeout: float = 10.0,
        check_first: Callable[[Callable[[str], list[Sample]]], None] = lambda instant: None,
    ):
        """check_first: given the first scrape's `instant`, raises where the exporter is not the one wanted (another
        run's), before the interval is waited out."""
        self.url = url
        self.timeout = timeout
        self.description = f"exporter {url}, {interval:g} s between scrapes"
        self.ended_meanwhile = ""
        self._first, first_time = self._scrape(), time.time()
        check_first(lambda name: list(self._first.get(name, [])))
        time.sleep(interval)
        try:
            self._second, self.now = self._scrape(), time.time()
        except RuntimeFailure:
            # The exporter went with its run between the scrapes: the first reading is all there is, and no rate.
            self._second, self.now = self._first, first_time
            self.ended_meanwhile = (
                f"the run ended meanwhile: its exporter was gone {interval:g} s after the first "
                "scrape, so this is judged from that one reading, with no rates"
            )
        self.window_seconds = self.now - first_time
        # The slow counters' own window: between the exporter's two reads of them, not between the scrapes.
        first_read, second_read = _slow_read(self._first, first_time), _slow_read(self._second, self.now)
        if first_read is None or second_read is None:  # an exporter that reads every field at every scrape
            self.slow_window_seconds = self.window_seconds
        elif first_read[0] == second_read[0]:  # the same read served twice
            self.slow_window_seconds = 0.0
        else:
            self.slow_window_seconds = second_read[1] - first_read[1]

    def _scrape(self) -> dict[str, list[Sample]]:
        samples: dict[str, list[Sample]] = defaultdict(list)
        try:
            text = _get(self.url, self.timeout).decode()  # the exposition format is UTF-8
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    samples[sample.name].append((sample.labels, sample.value))
        except ValueError as error:
            raise ConfigError(
                f"{self.url} does not serve Prometheus metrics ({error}); pass the exporter's "
                "/metrics URL or a Prometheus server's URL to --url"
            ) from None
        return samples

    def instant(self, name: str) -> list[Sample]:
        return list(self._second.get(name, []))

    def rate(self, name: str) -> list[Sample]:
        window = self.slow_window_seconds if name in SLOW_GPU_COUNTERS else self.window_seconds
        if window <= 0:
            return []  # the exporter did not read these counters again between the scrapes: no rate to tell
        before = {frozenset(labels.items()): value for labels, value in self._first.get(name, [])}
        rates = []
        for labels, value in self._second.get(name, []):
            previous = before.get(frozenset(labels.items()))
            if previous is None:
                continue  # a series born between the scrapes has no rate yet
            increase = value - previous if value >= previous else value  # a counter reset starts from 0
            rates.append((labels, increase / window))
        return rates


def _slow_read(samples: dict[str, list[Sample]], scraped_at: float) -> tuple[float, float] | None:
    """(how many slow reads the exporter has made, when it made the last one on this host's clock); None from an
    exporter without a sampler."""
    ages = [age for labels, age in samples.get(GPU_SAMPLE_AGE, []) if labels.get("cadence") == "slow"]
    reads = [n for labels, n in samples.get(GPU_SAMPLES, []) if labels.get("cadence") == "slow"]
    return (reads[0], scraped_at - ages[0]) if ages and reads else None


class PrometheusSource:
    def __init__(self, url: str, selector: str = "", window: str = PROMETHEUS_WINDOW, timeout: float = 10.0):
        """window: the rate() range. Prometheus divides by the whole range, so a series younger than the window
        reads low: the default matches the recording rules, a shorter one suits a run that just started."""
        self.url = url.rstrip("/")
        self.selector = selector
        self.window = window
        self.timeout = timeout
        self.description = (
            f"Prometheus {self.url}" + (f", series {{{selector}}}" if selector else "") + f", rates over {window}"
        )
        self.now = time.time()
        self.ended_meanwhile = ""  # Prometheus keeps the series of a run that has ended

    def _query(self, expression: str) -> list[Sample]:
        query = urllib.parse.urlencode({"query": expression})
        body = _get(f"{self.url}/api/v1/query?{query}", self.timeout)
        try:
            answer = json.loads(body)
            results = answer["data"]["result"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{self.url} did not answer a Prometheus query; pass a Prometheus server's URL, "
                "or an exporter's /metrics URL"
            ) from None
        samples = []
        for result in results:
            timestamp, value = result["value"]
            self.now = float(timestamp)
            if not math.isnan(float(value)):
                samples.append((result["metric"], float(value)))
        return samples

    def instant(self, name: str) -> list[Sample]:
        return self._query(f"{name}{{{self.selector}}}")

    def rate(self, name: str) -> list[Sample]:
        return self._query(f"rate({name}{{{self.selector}}}[{self.window}])")


def is_prometheus(url: str, timeout: float = 10.0) -> bool:
    """Prometheus answers its build-info API; an exporter answers only /metrics and /healthz."""
    try:
        answer = json.loads(_get(f"{url.rstrip('/')}/api/v1/status/buildinfo", timeout))
    except (RuntimeFailure, ValueError):
        return False
    return isinstance(answer, dict) and answer.get("status") == "success"


def open_source(
    url: str,
    kind: str,
    interval: float,
    selector: str = "",
    window: str = PROMETHEUS_WINDOW,
    check_first: Callable[[Callable[[str], list[Sample]]], None] = lambda instant: None,
) -> Source:
    """kind: exporter, prometheus or auto (a URL ending in /metrics is an exporter; else ask for build info).
    check_first: ExporterSource's."""
    if not urllib.parse.urlparse(url).scheme:
        url = "http://" + url
    if kind == "auto":
        kind = "exporter" if url.rstrip("/").endswith("/metrics") or not is_prometheus(url) else "prometheus"
    if kind == "prometheus":
        return PrometheusSource(url, selector, window)
    if selector or window != PROMETHEUS_WINDOW:
        raise ConfigError(
            "--job and --window apply to a Prometheus server; an exporter serves one job, and "
            "--interval sets its rate window"
        )
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    return ExporterSource(url, interval, check_first=check_first)
