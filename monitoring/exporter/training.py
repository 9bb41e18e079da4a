"""Training collector: the ranks' prometheus_client multiprocess files, merged fresh at each scrape.

The ranks write memory-mapped files named `<type>[_<gauge mode>]_<pid>.db` into the run's metrics directory
(docs/architecture.md lists the metrics). The directory is read at every scrape, so a directory the launcher makes
fresh for a new run is picked up, and a rank that died keeps its last values.

Files are read and merged as prometheus_client's MultiProcessCollector does (its file reader, its accumulation,
both through trainstack/promcompat.py), with one difference: the key naming each value (JSON of metric, sample and
labels) is parsed once and remembered across scrapes instead of at every scrape, a third of the merge's CPU
(bench/scrape_cost.py: 2.1 -> 1.3 ms for 8 ranks). tests/test_exporter_serving.py compares the result with
MultiProcessCollector's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric

from trainstack import promcompat

# Keys seen in a run's files; a new run or many pids in one directory start the memory again from empty.
MAX_REMEMBERED_KEYS = 20_000


class TrainingCollector:
    name = "training"

    def __init__(self, metrics_dir: Path | None):
        self._metrics_dir = metrics_dir
        self._keys: dict[str, tuple] = {}

    def collect(self) -> Iterable[Metric]:
        if self._metrics_dir is None or not self._metrics_dir.is_dir():
            return []
        return promcompat.accumulate(self._read(self._metrics_dir.glob("*.db")))

    def _read(self, files: Iterable[Path]) -> dict[str, Metric]:
        """Every value of every file as an unmerged sample of its metric (MultiProcessCollector._read_metrics)."""
        if len(self._keys) >= MAX_REMEMBERED_KEYS:
            self._keys.clear()
        metrics: dict[str, Metric] = {}
        for path in files:
            kind, mode, pid = promcompat.db_file_parts(path.name)
            try:
                values = promcompat.read_values(str(path))
            except FileNotFoundError:  # removed since the directory was listed (a new run clears it)
                continue
            for key, value, timestamp, _ in values:
                metric_name, sample_name, labels, documentation = self._parse(key)
                metric = metrics.get(metric_name)
                if metric is None:
                    metric = metrics[metric_name] = Metric(metric_name, documentation, kind)
                if kind == "gauge":
                    promcompat.set_gauge_mode(metric, mode)
                    metric.add_sample(sample_name, (*labels, ("pid", pid)), value, timestamp)
                else:
                    metric.add_sample(sample_name, labels, value)
        return metrics

    def _parse(self, key: str) -> tuple:
        parsed = self._keys.get(key)
        if parsed is None:
            metric_name, sample_name, labels, documentation = json.loads(key)
            parsed = self._keys[key] = (metric_name, sample_name, tuple(sorted(labels.items())), documentation)
        return parsed


def job_pids(metrics_dir: Path | None) -> frozenset[int]:
    """The processes of the training job: every pid that wrote a multiprocess file (`<type>[_<mode>]_<pid>.db`)."""
    if metrics_dir is None or not metrics_dir.is_dir():
        return frozenset()
    pids = set()
    for path in metrics_dir.glob("*.db"):
        pid = promcompat.db_file_parts(path.name)[2]
        if pid.isdigit():
            pids.add(int(pid))
    return frozenset(pids)
