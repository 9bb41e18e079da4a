"""The one reader of the ranks' prometheus_client multiprocess files (RUN_DIR/metrics/node-<n>/), for the
exporter's scrape, and each rank's progress from them for the launcher's hang watch and a rank that timed out.

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

from trainstack import catalog

HEADER_BYTES = 8  # the used-bytes count and its padding, before the first entry


def _sized_files(metrics_dir: Path) -> list[str]:
    files = []
    try:
        with os.scandir(metrics_dir) as entries:
            for entry in entries:
                try:
                    if entry.name.endswith(".db") and entry.stat().st_size >= HEADER_BYTES:
                        files.append(entry.path)
                except FileNotFoundError:
                    continue
    except FileNotFoundError:  # the folder went: a new launch is making it afresh
        return []
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


def progress_by_rank(metrics_dir: Path | str | None) -> dict[str, tuple[float, float, float]]:
    """rank -> (steps, forward passes, last step unix time), from every rank's files on this node: how the hang
    watch sees the ranks step, and how a rank that timed out in a collective names the peer that stopped, with no
    collective of its own."""
    wanted = {catalog.TRAIN_STEPS.name: 0, catalog.TRAIN_FORWARD_PASSES.name: 1, catalog.TRAIN_LAST_STEP.name: 2}
    progress: dict[str, list[float]] = {}
    for family in merged_metrics(metrics_dir):
        for sample in family.samples:
            if sample.name in wanted:
                progress.setdefault(sample.labels["rank"], [0.0, 0.0, 0.0])[wanted[sample.name]] = sample.value
    return {rank: (steps, forwards, last) for rank, (steps, forwards, last) in progress.items()}
