"""Read what a run left in its directory: per-rank telemetry records, the exporter's GPU snapshots, summary.json.
Formats: docs/architecture.md (rank records, summary) and docs/metrics.md (gpu.jsonl)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainstack import breakdown, ratios, record, window
from trainstack.errors import ConfigError
from trainstack.record import IntervalRecord, Launch
from trainstack.rundir import SHOWN, UNSEEN_RANKS, RunDir, Summary, read_json_lines, read_summary
from trainstack.window import RankWindow


@dataclass(frozen=True)
class RunFiles:
    run_dir: Path
    launches: dict[int, list[Launch]]
    """rank -> its launches (segments), each with its telemetry records in file order; ranks that recorded none
    are left out. Empty for a watched command with no instrumentation."""
    gpus: dict[tuple[int, str], list[dict]]
    """(NVML index, uuid) -> the exporter's snapshots of that GPU in time order; empty without a GPU."""
    summary: Summary
    """summary.json; empty while the run is still going or when rank 0 died before writing it."""
    time_breakdown: dict | None = None
    """Where each rank's time went, from the records (trainstack/breakdown.py); None from records without it."""

    @property
    def ranks(self) -> dict[int, list[IntervalRecord]]:
        """rank -> its records over every launch, in file order: what the figures plot."""
        return {rank: record.records(launches) for rank, launches in self.launches.items()}

    @property
    def steady(self) -> dict[int, RankWindow]:
        """rank -> its steady window (trainstack/record.py): what every figure the report states is of."""
        return {rank: found for rank, launches in self.launches.items() if (found := window.of_rank(rank, launches))}

    @property
    def start_time(self) -> float:
        times = [r.time for records in self.ranks.values() for r in records]
        times += [snapshot["time"] for snapshots in self.gpus.values() for snapshot in snapshots]
        return min(times)


def training_seconds(interval: IntervalRecord) -> float:
    """An interval's wall time less its pauses (evaluation, checkpoints, the startup): the time it trained."""
    return interval.interval_seconds - sum(pause.seconds for pause in interval.pauses)


def pauses(interval: IntervalRecord) -> list[tuple[int, str]]:
    """(step it came after, part) for each pause that ended in the interval."""
    return [(interval.first_step + pause.after_steps, pause.part) for pause in interval.pauses]


def measured_parts(records: list[IntervalRecord]) -> set[str]:
    """The breakdown parts a rank's records measured: host-bound idle only where NVML read its GPU, exposed
    communication only on a rank that communicates (DDP, FSDP); records older than the breakdown measured none."""
    parts = {part for r in records for part in r.time_parts or {}}
    if not any(r.host_bound_measured for r in records):
        parts.discard(breakdown.HOST_BOUND)
    if not any(r.comm_seconds is not None for r in records):
        parts.discard(breakdown.COMM_EXPOSED)
    return parts


def data_wait_ratio(interval: IntervalRecord) -> float | None:
    """ratios.DATA_WAIT_SHARE of one interval, as the input-bound alert's recording rule computes it over its
    window: on a GPU rank its starvation on the GPU's timeline, on a CPU rank the host's time blocked in the loader.
    An interval of steps too short to time counts its wall time."""
    return ratios.DATA_WAIT_SHARE.of(interval.data_wait_seconds, interval.stepped or interval.interval_seconds)


def on_gpu_clock(records: list[IntervalRecord]) -> bool:
    """Whether the rank timed its steps and data wait on its GPU's timeline (docs/metrics.md)."""
    return any(r.clock == "gpu" for r in records)


def read_gpu_log(path: Path) -> list[dict]:
    """The exporter's GPU snapshots in time order. A line a kill cut off is skipped."""
    return sorted((line for line in read_json_lines(path) if "time" in line), key=lambda line: line["time"])


def load_run(run_dir: Path) -> RunFiles:
    layout = RunDir(run_dir)
    launches = {rank: found for rank, found in record.read_run(layout).items() if record.records(found)}
    gpus: dict[tuple[int, str], list[dict]] = {}
    if layout.gpu_log.is_file():
        for snapshot in read_gpu_log(layout.gpu_log):
            gpus.setdefault((int(snapshot["gpu"]), snapshot.get("uuid", "")), []).append(snapshot)
    summary = read_summary(layout.summary)
    if not launches and not gpus and not summary:
        raise ConfigError(
            f"{run_dir} has no telemetry records ({SHOWN.rank_records('<r>')}) and no GPU snapshots "
            f"({SHOWN.gpu_log}): pass a trainstack run directory whose ranks ran at least one log interval with "
            f"telemetry on (a watched command's ranks record nothing where {UNSEEN_RANKS})"
        )
    return RunFiles(
        run_dir=run_dir,
        launches=launches,
        gpus=dict(sorted(gpus.items())),
        summary=summary,
        time_breakdown=breakdown.of_run(run_dir),
    )
