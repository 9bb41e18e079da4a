"""The parts of prometheus_client that are not its public API, in one place, for the version they were read from.

The exporter merges the ranks' multiprocess files itself (monitoring/exporter/training.py: it remembers parsed
keys across scrapes) and writes the text format itself (monitoring/exporter/exposition.py: it caches label
sets), both for the per-scrape CPU budget (bench/scrape_cost.py). That needs prometheus_client's file reader,
its file naming, its accumulation and its escaping, none of which are promised to stay. prometheus-client is
pinned exactly; this module refuses any other version in one line instead of serving wrong numbers, and
tests/test_exporter_serving.py and tests/test_exporter_exposition.py compare the results with the library's own.
Everything else uses the public API (Counter, Gauge, MultiProcessCollector.collect(), the parser).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

from trainstack.errors import ConfigError

WRITTEN_FOR = "0.26.0"

installed = importlib.metadata.version("prometheus-client")
if installed != WRITTEN_FOR:
    raise ConfigError(f"prometheus-client {installed} is installed, but the exporter uses internals of "
                      f"{WRITTEN_FOR} (trainstack/promcompat.py); install prometheus-client=={WRITTEN_FOR} "
                      "(pip install -r requirements.lock)")

# After the check: another version may lack these names, and the line above says why better than an ImportError.
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, gzip_accepted  # noqa: E402
from prometheus_client.metrics_core import Metric  # noqa: E402
from prometheus_client.mmap_dict import MmapedDict  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.openmetrics.exposition import (  # noqa: E402
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.utils import floatToGoString  # noqa: E402

TEXT_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the Prometheus text format 0.0.4
__all__ = ["TEXT_CONTENT_TYPE", "WRITTEN_FOR", "accumulate", "db_file_parts", "gzip_accepted",
           "label_name", "metric_name", "read_values", "sample_value", "set_gauge_mode"]


def db_file_parts(name: str) -> tuple[str, str, str]:
    """A multiprocess file's name `<type>[_<gauge mode>]_<pid>.db` as (type, gauge mode or "", pid)."""
    kind, _, rest = name.removesuffix(".db").partition("_")
    mode, _, pid = rest.rpartition("_")
    return kind, mode, pid


def read_values(path: str) -> list[tuple[str, float, float | None, int]]:
    """Every (key, value, timestamp, position) of one multiprocess file; the key is JSON of
    [metric, sample, labels, help]. FileNotFoundError when the file is gone."""
    return MmapedDict.read_all_values_from_file(path)


def set_gauge_mode(metric: Metric, mode: str) -> None:
    """How `accumulate` merges a gauge's per-process samples (the mode in its file name: mostrecent, max, ...)."""
    metric._multiprocess_mode = mode


def accumulate(metrics: dict[str, Metric]) -> Iterable[Metric]:
    """Unmerged per-process samples -> merged families, exactly as MultiProcessCollector.collect() merges them
    (counters summed, histograms accumulated into cumulative buckets, gauges by their mode)."""
    return MultiProcessCollector._accumulate_metrics(metrics, True)


def metric_name(name: str) -> str:
    """A metric name as the text format writes it (generate_latest's escaping)."""
    return escape_metric_name(name, UNDERSCORES)


def label_name(name: str) -> str:
    return escape_label_name(name, UNDERSCORES)


def sample_value(value: float) -> str:
    """A sample's value as generate_latest writes it (Go's float formatting: +Inf, NaN, 1e+06)."""
    return floatToGoString(value)
