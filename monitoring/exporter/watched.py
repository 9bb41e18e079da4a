"""The command `trainstack watch` runs, from the state it keeps in its node's metrics folder
(rundir.WATCHED_COMMAND_FILE): its command line and how many of its processes run, served at each scrape so that
diagnose tells a command running without instrumentation from no run at all (catalog.WATCH_*)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainstack import catalog
from trainstack.rundir import WATCHED_COMMAND_FILE


class WatchedCommandCollector(Collector):
    name = "watched command"

    def __init__(self, metrics_dir: Path | None):
        self._metrics_dir = metrics_dir

    def collect(self) -> Iterable[Metric]:
        if self._metrics_dir is None:
            return []
        try:
            state = json.loads((self._metrics_dir / WATCHED_COMMAND_FILE).read_text())
        except (OSError, ValueError):  # no watched command here (trainstack train, or the exporter alone)
            return []
        info = catalog.family(catalog.WATCH_COMMAND_INFO)
        info.add_metric([state["command"], state["run_id"]], 1)
        processes = catalog.family(catalog.WATCH_COMMAND_PROCESSES)
        processes.add_metric([], state["processes"])
        return [info, processes]
