"""A Snapshot from a run's telemetry records (docs/architecture.md, the run directory): what diagnose judges of a
finished run, from its files, where no exporter or Prometheus is left to ask.

Each rank's figures come from its records of the last launch (the segment markers separate launches), over its
training intervals after the first, whose steps include the warm-up. They are the same ratios the exporter's
counters give diagnose (trainstack/ratios.py), of the records' sums instead of the counters' rates.
"""

from __future__ import annotations

from pathlib import Path

from trainstack import breakdown, ratios
from trainstack.monitoring.diagnose.ceilings import of_snapshot
from trainstack.monitoring.diagnose.render import verdict_dicts
from trainstack.monitoring.diagnose.snapshot import RankView, Snapshot
from trainstack.monitoring.diagnose.thresholds import Thresholds
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.rundir import SEGMENT_MARKER, RunDir, read_json_lines


def last_launch(lines: list[dict]) -> list[dict]:
    """The interval records of a rank's last launch, in file order (all of them where no marker precedes)."""
    starts = [index for index, line in enumerate(lines) if SEGMENT_MARKER in line]
    first = starts[-1] + 1 if starts else 0
    return [line for line in lines[first:] if "time" in line]


def _sum(records: list[dict], key: str) -> float | None:
    """The records' sum of `key`; None unless every record has it (a figure a rank measures, it measures in each)."""
    if not records or any(key not in record for record in records):
        return None
    return sum(record[key] for record in records)


def rank_view(rank: int, records: list[dict], world_size: int) -> RankView | None:
    """One rank's figures from its last launch's interval records; None where it recorded none."""
    if not records:
        return None
    last = records[-1]
    judged = records[1:]
    steps = [seconds for record in judged for seconds in record["step_seconds"]]
    stepped, count = sum(steps), len(steps)
    interval = sum(record["interval_seconds"] for record in judged)

    def share(ratio: ratios.Ratio, seconds: float | None) -> float | None:
        return None if seconds is None else ratio.of(seconds, stepped)

    def per_step(ratio: ratios.Ratio, total: float | None) -> float | None:
        return None if total is None else ratio.of(total, count)

    host_bound = None
    if judged and all(record.get("host_bound_measured") for record in judged):
        host_bound = share(
            ratios.HOST_BOUND_SHARE, sum(record["time_parts"][breakdown.HOST_BOUND] for record in judged)
        )
    return RankView(
        rank=str(rank),
        steps=float(last["step"]),
        steps_per_second=count / interval if interval > 0 else None,
        samples_per_second=_sum(judged, "samples") / interval if judged and interval > 0 else None,
        data_wait_ratio=share(ratios.DATA_WAIT_SHARE, _sum(judged, "data_wait_seconds")),
        host_data_wait_ratio=share(ratios.HOST_DATA_WAIT_SHARE, _sum(judged, "host_data_wait_seconds")),
        clock=last.get("clock", "host"),
        step_seconds=ratios.STEP_SECONDS.of(stepped, count),
        forward_seconds=per_step(ratios.FORWARD_SECONDS, _sum(judged, "forward_seconds")),
        last_step_time=last["time"],
        comm_exposed_ratio=share(ratios.COMM_EXPOSED_SHARE, _sum(judged, "comm_exposed_seconds")),
        comm_seconds=per_step(ratios.COMM_SECONDS, _sum(judged, "comm_seconds")),
        comm_bytes_per_step=per_step(ratios.COMM_BYTES_PER_STEP, _sum(judged, "comm_bytes")),
        world_size=world_size,
        host_bound_ratio=host_bound,
    )


def snapshot_from_records(run_dir: Path | RunDir) -> Snapshot:
    """Every rank's view of the run's last launch, from telemetry/rank-<r>.jsonl; `now` is its newest record's
    time, so the last step's age reads from the end of the run."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    launches = {rank: last_launch(read_json_lines(path)) for rank, path in sorted(run.all_rank_records().items())}
    views = [
        view for rank, records in launches.items() if (view := rank_view(rank, records, len(launches))) is not None
    ]
    now = max((view.last_step_time for view in views if view.last_step_time is not None), default=0.0)
    return Snapshot(f"records in {run.telemetry} (the last launch, its intervals after the first)", now, views)


def judged(run_dir: Path | RunDir) -> list[dict] | None:
    """A finished run's verdicts, each with its ceiling, from its records, as `diagnose --json` gives them: what
    `train` and `watch` keep in summary.json (`verdicts`) and what compare shows. None where no rank recorded a
    step (a command without trainstack.monitor): nothing was judged, which an empty list (healthy) would hide."""
    snapshot = snapshot_from_records(run_dir)
    if not snapshot.ranks:
        return None
    return verdict_dicts(diagnose(snapshot, Thresholds()), of_snapshot(snapshot))
