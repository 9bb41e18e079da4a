"""A Snapshot from a run's telemetry records (docs/architecture.md, the run directory): what diagnose judges of a
finished run, from its files, where no exporter or Prometheus is left to ask.

Each rank's figures are those of its steady window (trainstack/record.py: the last launch's intervals after the
first, whose steps include the warm-up), from trainstack/window.py: the same ratios the exporter's counters give
diagnose (trainstack/ratios.py), of the records' sums instead of the counters' rates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainstack import breakdown, ceilings, record, window
from trainstack.errors import ConfigError
from trainstack.monitoring.diagnose.render import (
    NOTHING_RECORDED,
    NOTHING_RECORDED_BY_TRAIN,
    card,
    ending_lines,
    unjudged_line,
    verdict_dicts,
)
from trainstack.monitoring.diagnose.snapshot import RankView, Snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose, figures
from trainstack.rundir import LAUNCHER_TRAIN, RunDir
from trainstack.thresholds import Thresholds


def rank_view(steady: window.RankWindow, world_size: int, launcher: str = "") -> RankView:
    """One rank's figures from its steady window; `launcher` (rundir.LAUNCHER_TRAIN or _WATCH) picks the words of
    its fixes, which the records do not say."""
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
        launcher=launcher,
        paused_ratio=steady.paused_ratio,
    )


NO_INTERVAL = "no interval recorded in its last launch"


def _rank_windows(
    run: RunDir, cut: Callable[[list[record.Launch]], list[record.Launch]] = lambda launches: launches
) -> tuple[list[window.RankWindow], dict[str, str]]:
    """Each rank's steady window of its launches as `cut` leaves them, and rank -> why for the ranks that ran (a
    records file, or a gap below the highest rank that has one) but give nothing to judge. A file this trainstack
    cannot read is that rank's problem alone: the others are still judged."""
    windows, unjudged = [], {}
    files = run.all_rank_records()
    for rank, path in sorted(files.items()):
        try:
            found = window.of_rank(rank, cut(record.read_launches(path)))
        except ConfigError as unreadable:
            unjudged[str(rank)] = f"its records cannot be read: {unreadable}"
            continue
        if found is None:
            unjudged[str(rank)] = NO_INTERVAL
        else:
            windows.append(found)
    for rank in range(max(files, default=-1)):
        if rank not in files:
            unjudged[str(rank)] = "no records file"
    return windows, unjudged


STEADY_WINDOW = "the last launch, its intervals after the first"
JUDGED_STEPS_MIN = 5
"""The fewest steps after the first record's (the warm-up's) a finished run is judged from, in its last launch as
every verdict is. From fewer (a smoke test of 2 or 3 steps, a resumed run stopped soon after) one step's jitter, a
garbage collection or the scheduler taking a core, reads as the run's: a 2-step CPU run's second step once named a
straggler at 28%."""


def snapshot_from_records(run_dir: Path | RunDir, launcher: str = "") -> Snapshot:
    """Every rank's view of the run's steady window, from telemetry/rank-<r>.jsonl; `now` is its newest record's
    time, so the last step's age reads from the end of the run. Ranks that ran but left nothing to judge are in
    `unjudged`."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return _snapshot(run, _rank_windows(run), STEADY_WINDOW, launcher)


def snapshot_of_steps(run_dir: Path | RunDir, after: int, upto: int, launcher: str = "") -> Snapshot:
    """As snapshot_from_records, over the last launch's intervals within steps (after, upto] after the first of
    them (record.Launch.between_steps): one phase of a run that changed what it did at known steps, judged alone."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    windows = _rank_windows(run, lambda launches: [launches[-1].between_steps(after, upto)] if launches else [])
    return _snapshot(
        run, windows, f"the last launch's steps {after + 1}-{upto}, their intervals after the first", launcher
    )


def _snapshot(
    run: RunDir, found: tuple[list[window.RankWindow], dict[str, str]], which: str, launcher: str
) -> Snapshot:
    windows, unjudged = found
    world_size = len(windows) + len(unjudged)
    views = [rank_view(steady, world_size, launcher) for steady in windows]
    now = max((view.last_step_time or 0.0 for view in views), default=0.0)
    return Snapshot(f"records in {run.telemetry} ({which})", now, views, unjudged=unjudged)


@dataclass(frozen=True)
class Judgement:
    """A finished run judged from its records: what summary.json keeps and the end-of-run card shows."""

    verdicts: list[dict] | None
    """As `diagnose --json` gives them, each with its ceiling; None where no rank could be judged."""
    figures: dict
    not_judged: str | None = None
    """Why nothing was judged, where `verdicts` is None."""
    unjudged: dict[str, str] = field(default_factory=dict)
    """Rank -> why, for ranks that ran but could not be judged while others were."""

    def summary_keys(self) -> dict:
        """summary.json's `judged`, and `verdicts` or `not_judged`, and `ranks_not_judged` where some were not. A
        summary older than `judged` has `verdicts` where it was judged (`judged_of`)."""
        if self.verdicts is None:
            return {"judged": False, "not_judged": self.not_judged}
        return {
            "judged": True,
            "verdicts": self.verdicts,
            **({"ranks_not_judged": self.unjudged} if self.unjudged else {}),
        }


def judgement(run_dir: Path | RunDir, launcher: str = "") -> Judgement:
    """A finished run's verdicts from its records, or why none could be given (no rank recorded a step: a command
    without trainstack.monitor; too few steps after the warm-up to judge), which an empty list (healthy) would
    hide. `launcher`: who started the ranks (rundir.LAUNCHER_TRAIN: the fixes name train's flags; else the script's
    own knobs)."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    windows, unjudged = _rank_windows(run)
    snapshot = _snapshot(run, (windows, unjudged), STEADY_WINDOW, launcher)
    shown = figures(snapshot)
    if not snapshot.ranks:
        why = NOTHING_RECORDED_BY_TRAIN if launcher == LAUNCHER_TRAIN else NOTHING_RECORDED
        if snapshot.unjudged:
            why = "no rank could be judged: " + unjudged_line(snapshot.unjudged).removeprefix("not judged: ")
        return Judgement(None, shown, why)
    timed = max(steady.step_count for steady in windows)
    if timed < JUDGED_STEPS_MIN:
        why = (
            f"too few steps to judge: {timed} in the last launch after its first record (the warm-up's), a "
            f"verdict needs {JUDGED_STEPS_MIN}; train more steps"
        )
        return Judgement(None, shown, why)
    verdicts = verdict_dicts(diagnose(snapshot, Thresholds()), ceilings.of_ranks(snapshot.ranks))
    return Judgement(verdicts, shown, None, dict(snapshot.unjudged))


def judged(run_dir: Path | RunDir, launcher: str = "") -> list[dict] | None:
    """A finished run's verdicts, each with its ceiling, from its records, as `diagnose --json` gives them: what
    `train` and `watch` keep in summary.json (`verdicts`) and what compare shows. None where no rank recorded a
    step (a command without trainstack.monitor): nothing was judged, which an empty list (healthy) would hide."""
    return judgement(run_dir, launcher).verdicts


def judged_of(summary: Mapping) -> bool | None:
    """Whether summary.json says its run was judged: its `judged`, or for a summary older than that key, whether it
    has `verdicts`; None where the summary says nothing of it (a run that ended before its launcher judged it)."""
    if "judged" in summary:
        return bool(summary["judged"])
    return True if "verdicts" in summary else None


def launcher_of(summary: Mapping) -> str:
    """Who started a finished run's ranks, from its summary.json: watch says so; train's has its steps."""
    return summary.get("launcher") or (LAUNCHER_TRAIN if "steps" in summary else "")


def end_card(run_dir: Path | RunDir, summary: Mapping, ending: Sequence[str] | None = None) -> list[str]:
    """The end-of-run card (render.card) of a finished run: how it ended where it did not complete, the verdicts
    summary.json kept, or those its records give where it kept none (an older summary, or none), with each rank's
    time and the healthy run's throughput. `ending`: the card's first lines in place of how summary.json says the
    run ended (render.ending_lines)."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    fresh = judgement(run, launcher_of(summary))
    kept = judged_of(summary)
    if kept is None:
        verdicts, not_judged, unjudged = fresh.verdicts, fresh.not_judged, fresh.unjudged
    else:
        verdicts = summary.get("verdicts", []) if kept else None
        not_judged = None if kept else summary.get("not_judged") or NOTHING_RECORDED
        unjudged = dict(summary.get("ranks_not_judged") or {})
    times = summary.get("time_breakdown")
    if times is None:
        try:
            times = breakdown.of_run(run.path)
        except ConfigError:  # a rank's records this trainstack cannot read: the card says so, without times
            times = None
    figures = fresh.figures if fresh.verdicts is not None else None
    return card(verdicts, figures, times, not_judged, unjudged, ending_lines(summary) if ending is None else ending)
