"""The report's tables: summary.json as written, and one row of figures per rank."""

from __future__ import annotations

import statistics
import time

from trainstack import breakdown
from trainstack.monitoring.diagnose.render import duration
from trainstack.monitoring.report.runfiles import RunFiles, measured_parts, on_gpu_clock, training_seconds
from trainstack.record import IntervalRecord
from trainstack.rundir import Segment, Summary

NOT_MEASURED = "not measured"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def rank_rows(run: RunFiles) -> list[dict[str, object]]:
    """One row per rank, of its steady window (trainstack/record.py): what diagnose judges it by."""
    rows: list[dict[str, object]] = []
    for rank, steady in run.steady.items():
        training = sum(training_seconds(r) for r in steady.records)
        steps = [s for r in steady.records for s in r.step_seconds]
        samples = steady.total(lambda r: r.samples)
        rows.append(
            {
                "rank": rank,
                "steps": f"{steady.records[0].first_step + 1}-{steady.last.step}",  # the window's, as the rest
                "samples/s (training time)": samples / training if samples is not None and training > 0 else None,
                "median step (ms)": 1000 * statistics.median(steps) if steps else None,
                "p95 step (ms)": 1000 * _percentile(steps, 0.95) if steps else None,
                "data-wait ratio": steady.data_wait_ratio,
            }
        )
        if on_gpu_clock(steady.records):
            # The data wait above is the GPU's starvation; the host's own wait, which alone would mislead on a
            # GPU (it can wait while the GPU works through queued steps), goes beside it.
            rows[-1]["data wait measured on"] = "GPU timeline"
            rows[-1]["host-wait ratio"] = steady.host_data_wait_ratio
        rows[-1] |= _gpu_activity(steady.records)
    shown = [column for column in ACTIVITY_COLUMNS.values() if any(column in row for row in rows)]
    return [row | {column: row.get(column) for column in shown} for row in rows]  # the same columns on every row


# Record field -> its column: what the rank's GPU really did (GPM), where its records carry it.
ACTIVITY_COLUMNS = {"sm_active_ratio": "SM activity", "tensor_active_ratio": "tensor activity"}


def _gpu_activity(records: list[IntervalRecord]) -> dict[str, float]:
    """Each GPM field's mean over the intervals that carry it, weighted by their length; none without GPM."""
    columns = {}
    for field, column in ACTIVITY_COLUMNS.items():
        carried = [(value, r.interval_seconds) for r in records if (value := getattr(r, field)) is not None]
        if carried and (seconds := sum(w for _, w in carried)) > 0:
            columns[column] = sum(v * w for v, w in carried) / seconds
    return columns


def segment_rows(segments: list[Segment]) -> list[dict[str, object]]:
    """summary.json's segments: one row per launch, with the time it waited after the one before (in a requeued
    job, in the queue; the time breakdown's between_segments), on rank 0's clock: "-" for the first."""
    ends = [None, *(segment.get("ended") for segment in segments)]
    return [
        {
            "segment": number,
            "run id": segment.get("run_id"),
            "waited before (s)": None if previous is None else max(0.0, segment["started"] - previous),
            "started": date(segment["started"]),
            "steps": f"{segment.get('first_step')} to {segment.get('last_step')}",
            "training (s)": segment.get("train_seconds"),
            "samples/s": segment["samples"] / segment["train_seconds"] if segment.get("train_seconds") else None,
            "ended": segment.get("exit_reason"),
        }
        for number, (segment, previous) in enumerate(zip(segments, ends, strict=False), start=1)
    ]


# summary.json's keys the header shows, and those with tables or a card of their own: the summary table leaves
# them out, so no figure is said twice.
HEADER_KEYS = ("command", "exit_code", "exit_reason", "started", "wall_seconds", "world_size")
OWN_TABLES = (
    "segments",
    "evaluations",
    "time_breakdown",
    "ceilings",
    "verdicts",
    "judged",
    "not_judged",
    "ranks_not_judged",
)


def date(unix_seconds: float) -> str:
    """A unix time as a local date people read, with its zone (a report travels: attached to a ticket, opened from a
    pod's volume), as the page's own date."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix_seconds))


def value_text(key: str, value: object) -> object:
    """A summary.json value as people read it: its unix times as dates, its durations in h/m/s."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key in ("started", "launched_at", "ended") or key.endswith("_at"):
            return date(value)
        if key == "wall_seconds" or (key.endswith("_seconds") and "per" not in key):
            return duration(value)
    return value


def header_rows(run: RunFiles) -> list[dict[str, object]]:
    """What ran and how it ended, from summary.json: the command, its exit code, when it started and for how long,
    the ranks."""
    summary = run.summary
    shown = {
        "command": summary.get("command") or ("trainstack train" if "steps" in summary else None),
        "exit code": summary.get("exit_code"),
        "ended": summary.get("exit_reason"),
        "started": value_text("started", started) if (started := _started(summary)) is not None else None,
        "duration": value_text("wall_seconds", _duration(summary)),
        "world size": summary.get("world_size"),
    }
    return [{"": key, "value": value} for key, value in shown.items() if value is not None or key != "started"]


def _duration(summary: Summary) -> float | None:
    """How long the run took from `started` on: watch's command's wall time; train's from its first launch's start
    to its last launch's end, on rank 0's clock (its `wall_seconds` is the last launch's alone, from the ranks'
    start-up on)."""
    segments = summary.get("segments") or []
    if "started" not in summary and segments and segments[-1].get("ended") is not None:
        return segments[-1]["ended"] - segments[0]["started"]
    return summary.get("wall_seconds")


def _started(summary: Summary) -> float | None:
    """When the run started: watch's `started`, or train's first segment's."""
    if "started" in summary:
        return summary["started"]
    segments = summary.get("segments") or []
    return segments[0].get("started") if segments else None


def summary_rows(run: RunFiles) -> list[dict[str, object]]:
    """summary.json's other fields: those the header, the card and their own tables do not show."""
    return [
        {"field": key, "value": value_text(key, value)}
        for key, value in run.summary.items()
        if key not in HEADER_KEYS + OWN_TABLES
    ]


def time_rows(run: RunFiles) -> list[dict[str, object]]:
    """Where each rank's wall time went, over every launch: one column per rank, its seconds and share of its own
    wall time (ranks run side by side: their seconds are not added). A part the rank did not measure (host-bound
    idle on a CPU, communication on a rank without DDP or FSDP) reads "not measured", never 0."""
    times = run.time_breakdown
    assert times is not None, "a run without a time breakdown has no time table"
    ranks = times["ranks"]
    measured = {
        row["rank"]: measured_parts(run.ranks.get(row["rank"], []))
        | {part for part in breakdown.PARTS if part not in breakdown.STEP_PARTS}
        for row in ranks
    }
    rows: list[dict[str, object]] = [
        {"part": "wall time (s)", **{f"rank {row['rank']}": row["wall_seconds"] for row in ranks}}
    ]
    for part in times["parts"]:
        cells: dict[str, object] = {"part": part}
        for row in ranks:
            seconds, wall = row["seconds"][part], row["wall_seconds"]
            cells[f"rank {row['rank']}"] = (
                (f"{seconds:.4g} s ({100 * seconds / wall:.1f}%)" if wall > 0 else seconds)
                if part in measured[row["rank"]]
                else NOT_MEASURED
            )
        rows.append(cells)
    return rows


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
