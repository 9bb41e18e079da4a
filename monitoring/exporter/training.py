"""Training collector: the ranks' prometheus_client multiprocess files, merged at each scrape
(trainstack/metric_files.py, prometheus_client's MultiProcessCollector merge).

The ranks write memory-mapped files named `<type>[_<gauge mode>]_<pid>.db` into the run's metrics directory
(docs/architecture.md lists the metrics). The directory is read at every scrape, so a directory the launcher makes
fresh for a new run is picked up, and a rank that exited keeps its last values (nothing marks its files dead).
The ranks' gauges keep the most recent value (catalog.rank_metric), so the merge serves them without a `pid`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainstack.metric_files import merged_metrics


class TrainingCollector(Collector):
    name = "training"

    def __init__(self, metrics_dir: Path | None):
        self._metrics_dir = metrics_dir

    def collect(self) -> Iterable[Metric]:
        return merged_metrics(self._metrics_dir)
