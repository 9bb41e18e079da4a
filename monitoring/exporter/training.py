"""Training collector: the ranks' prometheus_client multiprocess files, merged fresh at each scrape.

The ranks write memory-mapped files named `<type>_<pid>.db` into the run's metrics directory (docs/architecture.md
lists the metrics); prometheus_client's MultiProcessCollector merges them. The directory is read at every scrape,
so a directory the launcher makes fresh for a new run is picked up, and a rank that died keeps its last values.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


class TrainingCollector:
    name = "training"

    def __init__(self, metrics_dir: Path | None):
        self._metrics_dir = metrics_dir

    def collect(self) -> Iterable[Metric]:
        if self._metrics_dir is None or not self._metrics_dir.is_dir():
            return []
        return MultiProcessCollector(None, path=str(self._metrics_dir)).collect()


def job_pids(metrics_dir: Path | None) -> frozenset[int]:
    """The processes of the training job: every pid that wrote a multiprocess file (`<type>[_<mode>]_<pid>.db`)."""
    if metrics_dir is None or not metrics_dir.is_dir():
        return frozenset()
    pids = set()
    for path in metrics_dir.glob("*.db"):
        pid = path.stem.rpartition("_")[2]
        if pid.isdigit():
            pids.add(int(pid))
    return frozenset(pids)
