"""A Snapshot from a run's telemetry records (docs/architecture.md, the run directory): what diagnose judges of a
finished run, from its files, where no exporter or Prometheus is left to ask.

Each rank's figures are those of its steady window (trainstack/record.py: the last launch's intervals after the
first, whose steps include the warm-up), from trainstack/window.py: the same ratios the exporter's counters give
diagnose (trainstack/ratios.py), of the records' sums instead of the counters' rates.
"""

from __future__ import annotations

from pathlib import Path

from trainstack import ceilings, window
from trainstack.monitoring.diagnose.render import verdict_dicts
from trainstack.monitoring.diagnose.snapshot import RankView, Snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.rundir import RunDir
from trainstack.thresholds import Thresholds


def rank_view(steady: window.RankWindow, world_size: int) -> RankView:
    """One rank's figures from its steady window."""
    return RankView(
        rank=str(steady.rank),
        steps=float(steady.last.step),
        steps_per_second=steady.steps_per_second,
        samples_per_second=steady.samples_per_second,
        data_wait_ratio=steady.data_wait_ratio,
        host_data_wait_ratio=steady.host_data_wait_ratio,
        clock=steady.last.clock or "host",
        step_seconds=steady.step_seconds,
        forward_seconds=steady.forward_seconds,
        last_step_time=steady.last.time,
        comm_exposed_ratio=steady.comm_exposed_ratio,
        comm_seconds=steady.comm_seconds,
        comm_bytes_per_step=steady.comm_bytes_per_step,
        world_size=world_size,
        host_bound_ratio=steady.host_bound_ratio,
    )


def snapshot_from_records(run_dir: Path | RunDir) -> Snapshot:
    """Every rank's view of the run's steady window, from telemetry/rank-<r>.jsonl; `now` is its newest record's
    time, so the last step's age reads from the end of the run."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    world_size = len(run.all_rank_records())
    views = [rank_view(steady, world_size) for steady in window.of_run(run)]
    now = max((view.last_step_time or 0.0 for view in views), default=0.0)
    return Snapshot(f"records in {run.telemetry} (the last launch, its intervals after the first)", now, views)


def judged(run_dir: Path | RunDir) -> list[dict] | None:
    """A finished run's verdicts, each with its ceiling, from its records, as `diagnose --json` gives them: what
    `train` and `watch` keep in summary.json (`verdicts`) and what compare shows. None where no rank recorded a
    step (a command without trainstack.monitor): nothing was judged, which an empty list (healthy) would hide."""
    snapshot = snapshot_from_records(run_dir)
    if not snapshot.ranks:
        return None
    return verdict_dicts(diagnose(snapshot, Thresholds()), ceilings.of_ranks(snapshot.ranks))
