"""The latest stall's verdict, from the evidence the launcher collected into RUN_DIR/hang (trainstack/hang_verdict.py),
served at each scrape beside the run's other series: `trainstack diagnose` and Prometheus then name where each
rank waits, not only that no rank steps. Reading it is a directory listing and one small file while no stall has
been collected, so a scrape pays nothing for it.

Only the current launch's stall is served (`latest_hang` given the metrics folder): an earlier launch's would read
as this launch hanging until its first step."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainstack import catalog
from trainstack.hang_verdict import latest_hang


class HangCollector(Collector):
    name = "hang"

    def __init__(self, run_dir: Path | None, metrics_dir: Path | None = None):
        self._run_dir, self._metrics_dir = run_dir, metrics_dir

    def collect(self) -> Iterable[Metric]:
        if self._run_dir is None:
            return []
        found = latest_hang(self._run_dir, [self._metrics_dir] if self._metrics_dir is not None else [])
        if found is None:
            return []
        hang, collected_at = found
        family = catalog.family(catalog.HANG_EVIDENCE)
        family.add_metric([hang.headline, ",".join(map(str, hang.culprits)), hang.fix], collected_at)
        return [family]
