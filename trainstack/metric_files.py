"""The one reader of the ranks' prometheus_client multiprocess files (RUN_DIR/metrics/node-<n>/), for the
exporter's scrape, the launcher's hang watch and a rank's look at its peers' progress.

It reads as prometheus_client's MultiProcessCollector does, through its public `merge`, but skips a file too short
to hold the header: a rank creates its file empty and only then sizes it (prometheus_client's MmapedDict), and a
reader that lands between the two, or a rank killed there, would otherwise fail every read with a `struct.error`.
A file removed between the listing and the read (a new launch clearing the folder) makes it read the folder again.
Import it where it is used, not at the top of a rank's module: prometheus_client picks its multiprocess mode when
first imported (catalog.rank_metric).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

HEADER_BYTES = 8  # the used-bytes count and its padding, before the first entry


def _sized_files(metrics_dir: Path) -> list[str]:
    files = []
    for entry in os.scandir(metrics_dir):
        if not entry.name.endswith(".db"):
            continue
        try:
            if entry.stat().st_size >= HEADER_BYTES:
                files.append(entry.path)
        except FileNotFoundError:
            continue
    return files


def _merge(metrics_dir: Path) -> list[Metric]:
    return list(MultiProcessCollector.merge(_sized_files(metrics_dir), accumulate=True))


def merged_metrics(metrics_dir: Path | str | None) -> list[Metric]:
    """Every metric in the folder's files, merged across the ranks; [] where there is no such folder."""
    if not metrics_dir or not Path(metrics_dir).is_dir():
        return []
    try:
        return _merge(Path(metrics_dir))
    except FileNotFoundError:  # a file went between the listing and the read: a new launch is clearing the folder
        return _merge(Path(metrics_dir))
