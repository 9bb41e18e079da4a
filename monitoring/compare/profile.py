"""What compare reads of one run directory: its steady rates, the time breakdown per step, per-rank step times, its
verdicts and its settings. From the files every run leaves (rank records, and config.yaml, summary.json and each
node's recorded environment where the run wrote them), so a `train` run and a watched run with trainstack.monitor
compare alike."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainstack import breakdown, environment, record, window
from trainstack.errors import ConfigError
from trainstack.monitoring.diagnose.finished import NOTHING_RECORDED, judged_of, judgement, launcher_of
from trainstack.rundir import CONFIG_FILE, SHOWN, SUMMARY_FILE, UNSEEN_RANKS, RunDir, read_summary
from trainstack.window import RankWindow

SUMMARY_SETTINGS = ("command", "world_size", "distributed_type", "device", "mixed_precision", "model", "dataset")
RECORD_SETTINGS = ("clock", "param_bytes", "grad_bytes")


@dataclass(frozen=True)
class Rate:
    steps_per_second: float
    samples_per_second: float


def steady_rate(windows: list[RankWindow]) -> Rate | None:
    """Steps/s (the ranks' median) and samples/s (their sum) over each rank's steady window (trainstack/record.py):
    the first record of a launch holds the warm-up (first batches, allocator, compile), which a short run would
    otherwise be judged by. None where no rank has a record past its first."""
    steps, samples = [], 0.0
    for steady in windows:
        if (rate := steady.steps_per_second) is not None and (sampled := steady.samples_per_second) is not None:
            steps.append(rate)
            samples += sampled
    return Rate(statistics.median(steps), samples) if steps else None


@dataclass(frozen=True)
class RunProfile:
    run_dir: Path
    rate: Rate | None
    goodput: float | None
    seconds_per_step: dict[str, float]
    """breakdown.STEP_PARTS: seconds per step, the ranks' mean; the other parts: seconds per rank."""
    rank_step_seconds: dict[int, float]
    """Each rank's median step time."""
    verdicts: dict[str, str]
    """Verdict kind -> what its fix can gain at most (`_verdicts`), kept in summary.json or judged from the records."""
    not_judged: str | None
    """Why nothing was judged (no rank recorded a step): `verdicts` empty then is no health."""
    settings: dict[str, object]
    model: str | None
    param_bytes: int | None


def _not_a_run(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} is not a trainstack run directory: it has no {CONFIG_FILE}, {SUMMARY_FILE} or "
        f"telemetry records ({SHOWN.rank_records('<r>')})"
    )


def _per_step(times: dict, steps: float) -> dict[str, float]:
    ranks = len(times["ranks"])
    return {
        part: seconds / ranks / (steps if part in breakdown.STEP_PARTS else 1)
        for part, seconds in times["seconds"].items()
    }


def _verdicts(summary: dict, run_dir: Path) -> tuple[dict[str, str], str | None]:
    """Verdict kind -> what its fix can gain at most (its ceiling's words; its summary where it has no ceiling, a
    stall): those summary.json kept at the run's end, else judged now from the records; and why nothing was judged,
    where nothing was."""
    kept = judged_of(summary)
    if kept is None:
        found = judgement(run_dir, launcher_of(summary))
        verdicts, not_judged = found.verdicts, found.not_judged
    else:
        verdicts = summary.get("verdicts") if kept else None
        not_judged = None if kept else summary.get("not_judged") or NOTHING_RECORDED
    return {v["kind"]: (v.get("ceiling") or {}).get("text") or v.get("summary", "") for v in verdicts or []}, not_judged


def load(run_dir: Path) -> RunProfile:
    layout = RunDir(run_dir)
    launches = record.read_run(layout)
    records = {
        rank: lines for rank, found in launches.items() if (lines := [r for r in record.records(found) if r.step_count])
    }
    config_path = run_dir / CONFIG_FILE
    if not run_dir.is_dir() or not (records or config_path.is_file() or layout.summary.is_file()):
        raise _not_a_run(run_dir)
    if not records:
        raise ConfigError(
            f"{run_dir} has no telemetry records with steps ({SHOWN.rank_records('<r>')}): a run "
            f"compares by what its ranks recorded (a watched command's ranks record nothing where {UNSEEN_RANKS})"
        )
    summary: dict[str, Any] = dict(read_summary(layout.summary))  # read by keys from a list, so a plain dict
    try:
        config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        detail = (str(error).splitlines() or [""])[0]
        raise ConfigError(
            f"{config_path} is not a readable config ({detail}); move it away to compare the run"
        ) from None
    if not isinstance(config, dict | None):
        raise ConfigError(f"{config_path} is not a trainstack config (not key: value pairs); move it away")
    times = breakdown.of_run(run_dir)
    steps = statistics.median(sum(r.step_count or 0 for r in lines) for lines in records.values())
    last = records[min(records)][-1]
    windows = window.of_launches(launches)
    settings = {
        **{f"config.{k}": v for k, v in (config or {}).items() if k != "output_dir"},
        **{f"summary.{k}": summary[k] for k in SUMMARY_SETTINGS if k in summary},
        **{f"records.{k}": value for k in RECORD_SETTINGS if (value := getattr(last, k)) is not None},
        "ranks": len(records),
        **environment.settings({node: environment.read(path) for node, path in layout.environments().items()}),
    }
    verdicts, not_judged = _verdicts(summary, run_dir)
    return RunProfile(
        run_dir=run_dir,
        rate=steady_rate(windows),
        goodput=times["goodput"] if times else None,
        seconds_per_step=_per_step(times, steps) if times else {},
        rank_step_seconds={
            steady.rank: statistics.median(s for r in steady.records for s in r.step_seconds)
            for steady in windows
            if any(r.step_seconds for r in steady.records)
        },
        verdicts=verdicts,
        not_judged=not_judged,
        settings=settings,
        model=summary.get("model") or (config or {}).get("model"),
        param_bytes=last.param_bytes,
    )
