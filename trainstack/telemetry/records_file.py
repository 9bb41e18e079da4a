"""The rank's records file, telemetry/rank-<r>.jsonl: one JSON line per log interval, for the run report."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from trainstack.record import SegmentStarted
from trainstack.rundir import LAUNCHED_AT_ENV
from trainstack.telemetry.device import RankIdentity


def launch_time() -> float:
    """When this rank's launch began: the launcher's TRAINSTACK_LAUNCHED_AT, else (a rank started by other means)
    this process's own start."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return psutil.Process().create_time()


def open_records(path: Path, identity: RankIdentity, launched_at: float):
    """A resumed run appends: its file starts each launch (segment) with a marker line, which says when the launch
    began. The marker has no "time" key, so readers of records alone skip it; a record cut off by a kill is ended
    first, never glued to it."""
    records = path.open("a", buffering=1)
    if records.tell():
        with path.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":
                records.write("\n")
    records.write(SegmentStarted(time.time(), identity.rank, identity.run_id, launched_at).to_json() + "\n")
    return records
