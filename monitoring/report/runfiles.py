"""Read what a run left in its directory: per-rank telemetry records, the exporter's GPU snapshots, summary.json.
Formats: docs/architecture.md (rank records, summary) and docs/metrics.md (gpu.jsonl)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainstack import breakdown, ratios
from trainstack.errors import ConfigError
from trainstack.rundir import SHOWN, RunDir, Summary, read_json_lines, read_rank_records, read_summary


@dataclass(frozen=True)
class RunFiles:
    run_dir: Path
    ranks: dict[int, list[dict]]
    """rank -> its telemetry records in time order, over every segment (launch) of the run; each record's
    "segment" numbers the launch that wrote it, from 0. Empty for a watched command with no instrumentation."""
    gpus: dict[tuple[int, str], list[dict]]
    """(NVML index, uuid) -> the exporter's snapshots of that GPU in time order; empty without a GPU."""
    summary: Summary
    """summary.json; empty while the run is still going or when rank 0 died before writing it."""
    time_breakdown: dict | None = None
    """Where each rank's time went, from the records (trainstack/breakdown.py); None from records without it."""

    @property
    def start_time(self) -> float:
        times = [r["time"] for records in (*self.ranks.values(), *self.gpus.values()) for r in records]
        return min(times)


def training_seconds(record: dict) -> float:
    """An interval's wall time less its pauses (evaluation, checkpoints, the startup): the time it trained."""
    return record["interval_seconds"] - sum(pause["seconds"] for pause in record.get("paused", []))


def pauses(record: dict) -> list[tuple[int, str]]:
    """(step it came after, part) for each pause that ended in the interval."""
    first = record["step"] - record.get("step_count", 0)
    return [(first + pause["after_steps"], pause["part"]) for pause in record.get("paused", [])]


def measured_parts(records: list[dict]) -> set[str]:
    """The breakdown parts a rank's records measured: host-bound idle only where NVML read its GPU, exposed
    communication only on a rank that communicates (DDP, FSDP); records older than the breakdown measured none."""
    parts = {part for record in records for part in record.get("time_parts", {})}
    if not any(record.get("host_bound_measured") for record in records):
        parts.discard(breakdown.HOST_BOUND)
    if not any("comm_seconds" in record for record in records):
        parts.discard(breakdown.COMM_EXPOSED)
    return parts


def _step_time(records: list[dict]) -> float:
    """The records' step time; records of steps too short to time count their interval's wall time."""
    return sum(sum(r["step_seconds"]) for r in records) or sum(r["interval_seconds"] for r in records)


def data_wait_ratio(records: list[dict]) -> float | None:
    """ratios.DATA_WAIT_SHARE over the records, as the input-bound alert's recording rule computes it over its
    window: on a GPU rank its starvation on the GPU's timeline, on a CPU rank the host's time blocked in the loader."""
    return ratios.DATA_WAIT_SHARE.of(sum(r["data_wait_seconds"] for r in records), _step_time(records))


def host_data_wait_ratio(records: list[dict]) -> float | None:
    """ratios.HOST_DATA_WAIT_SHARE over the records; records older than the field only had the host's wait."""
    waited = sum(r.get("host_data_wait_seconds", r["data_wait_seconds"]) for r in records)
    return ratios.HOST_DATA_WAIT_SHARE.of(waited, _step_time(records))


def on_gpu_clock(records: list[dict]) -> bool:
    """Whether the rank timed its steps and data wait on its GPU's timeline (docs/metrics.md)."""
    return any(r.get("clock") == "gpu" for r in records)


def read_jsonl(path: Path) -> list[dict]:
    """Records in time order. A rank killed mid-write leaves a partial last line: that one is skipped."""
    return sorted((record for record in read_json_lines(path) if "time" in record), key=lambda record: record["time"])


def load_run(run_dir: Path) -> RunFiles:
    layout = RunDir(run_dir)
    ranks = {rank: records for rank, path in layout.all_rank_records().items() if (records := read_rank_records(path))}
    gpus: dict[tuple[int, str], list[dict]] = {}
    if layout.gpu_log.is_file():
        for snapshot in read_jsonl(layout.gpu_log):
            gpus.setdefault((int(snapshot["gpu"]), snapshot.get("uuid", "")), []).append(snapshot)
    summary = read_summary(layout.summary)
    if not ranks and not gpus and not summary:
        raise ConfigError(
            f"{run_dir} has no telemetry records ({SHOWN.rank_records('<r>')}) and no GPU snapshots "
            f"({SHOWN.gpu_log}): pass a trainstack run directory whose ranks ran at least one log interval with "
            "telemetry on (a watched command records ranks only with trainstack.monitor in its loop)"
        )
    return RunFiles(
        run_dir=run_dir,
        ranks=ranks,
        gpus=dict(sorted(gpus.items())),
        summary=summary,
        time_breakdown=breakdown.of_run(run_dir),
    )
