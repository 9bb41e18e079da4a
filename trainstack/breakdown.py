"""Where each rank's wall time went: the parts, how a step's time splits into them, and their sums over a run.

A rank's wall time, from its launch (`TRAINSTACK_LAUNCHED_AT`) to its exit, splits into parts that are each measured
on their own (trainstack/telemetry/ writes them into the rank's records, and into the
time-by-part counter of the metric catalog, `catalog.TRAIN_TIME`):

- the steps' time, on the device's clock on a GPU, split into data starvation and exposed communication (both timed
  as they happen), host-bound idle (GPU ranks: NVML's utilization samples say how long the device idled; the part
  not explained by starvation is the host's) and compute, the rest of the step;
- the pauses the loop takes, timed around them: evaluation, checkpoint save, checkpoint load (resume), compile;
- startup: from the launch to the first step, less any pause before it.

The launch-to-exit time is measured apart from the parts, so what no part accounts for is left over as `other`:
a sum of parts that misses or double-counts time shows there. Progress lost to restarts is known only once a later
launch resumes from an earlier checkpoint than the one this launch trained past: the time of the steps it then
trained again (and of the pauses among them) moves from their parts to `lost_progress`.

A run stopped and started again (a requeued Slurm job, a preempted pod, a rerun by hand) runs in segments, one launch
each; the time from one segment's end to the next one's launch (waiting in the queue, the restart) is no launch's:
each rank counts it as `between_segments`, in the row of the segment it waited for, so a rank's wall time runs from
its first launch to its last exit. Goodput is the compute share of that whole wall time: it drops while a job waits
to be requeued.

Nothing here imports torch: the launcher (summary.json) and the run report read the records through this module.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from trainstack import record
from trainstack.record import Launch, Pause

COMPUTE = "compute"
COMM_EXPOSED = "comm_exposed"
DATA_STARVATION = "data_starvation"
HOST_BOUND = "host_bound"
COMPILE = "compile"
STARTUP = "startup"
EVALUATION = "evaluation"  # the pauses a loop names (PAUSES)
CHECKPOINT_SAVE = "checkpoint_save"
CHECKPOINT_LOAD = "checkpoint_load"
LOST_PROGRESS = "lost_progress"
BETWEEN_SEGMENTS = "between_segments"
OTHER = "other"

PARTS = {
    COMPUTE: "the device computing: step time less data starvation, exposed communication and host-bound idle",
    COMM_EXPOSED: "waiting for gradient communication that backward compute did not hide (DDP ranks)",
    DATA_STARVATION: "the device idle for want of the next batch",
    HOST_BOUND: "the device idle although neither starved nor waiting on communication (GPU ranks, from NVML's "
    "utilization samples; not measured on CPU ranks)",
    EVALUATION: "evaluating on the held-out set",
    CHECKPOINT_SAVE: "saving a checkpoint",
    CHECKPOINT_LOAD: "loading the checkpoint a launch resumes from",
    COMPILE: "torch.compile: the steps during which it compiled, and pauses to compile",
    STARTUP: "launch to the first step, less any pause before it",
    LOST_PROGRESS: "steps, and the pauses among them, that a later launch trained again after resuming from an "
    "earlier checkpoint",
    BETWEEN_SEGMENTS: "from a segment's end to the next segment's launch: waiting in the queue, the restart",
    OTHER: "wall time no part accounts for (launch to exit less every part)",
}
"""Every part, in the order tables and figures show them."""
STEP_PARTS = (COMPUTE, COMM_EXPOSED, DATA_STARVATION, HOST_BOUND)
"""The parts a step's time splits into (`split_step_time`)."""
PAUSES = (EVALUATION, CHECKPOINT_SAVE, CHECKPOINT_LOAD, COMPILE)
"""The pauses a loop times around its code (trainstack.monitor's `pause`)."""
PAUSE_WORDS = {
    EVALUATION: "evaluating",
    CHECKPOINT_SAVE: "saving checkpoints",
    CHECKPOINT_LOAD: "loading a checkpoint",
    COMPILE: "compiling",
}
"""Each pause as a verdict's evidence says what a rank spent its time on."""
LIVE_PARTS = tuple(part for part in PARTS if part not in (LOST_PROGRESS, BETWEEN_SEGMENTS, OTHER))
"""The parts a rank measures as it runs (the counter's `part` values); the last three are known only afterwards."""


def split_step_time(
    step_seconds: float, data_starvation: float, comm_exposed: float, busy_share: float | None
) -> dict[str, float]:
    """A stretch of steps' time into STEP_PARTS. Starvation and exposed communication are measured; the device
    idled (1 - busy_share) of the steps' time, and the idle time starvation does not explain was the host's: kernels
    launched too slowly, host synchronizations. NCCL's kernels keep running while they wait, so exposed communication
    counts as busy. busy_share None (a CPU rank, or no NVML sample): host-bound idle is not measured and reads 0.
    Compute is what is left; a part measured over the whole never exceeds it."""
    waiting = data_starvation + comm_exposed
    host_bound = 0.0
    if busy_share is not None:
        host_bound = max(0.0, min((1 - busy_share) * step_seconds - data_starvation, step_seconds - waiting))
    return {
        COMPUTE: max(0.0, step_seconds - waiting - host_bound),
        COMM_EXPOSED: comm_exposed,
        DATA_STARVATION: data_starvation,
        HOST_BOUND: host_bound,
    }


@dataclass(frozen=True)
class Spent:
    """Seconds of one part, spread over the steps after `first_step` up to `last_step`; a pause has first_step ==
    last_step, the step it came after. None: the step is unknown (a launch that recorded no interval)."""

    part: str
    seconds: float
    first_step: int | None
    last_step: int | None

    def lost_share(self, redone_after: int | None) -> float:
        """The share of these seconds spent on steps after `redone_after`, which a later launch trained again."""
        if redone_after is None or self.first_step is None or self.last_step is None or self.last_step <= redone_after:
            return 0.0
        if self.last_step == self.first_step:
            return 1.0
        return (self.last_step - max(self.first_step, redone_after)) / (self.last_step - self.first_step)


@dataclass
class SegmentTimes:
    """One launch of one rank, as its records tell it."""

    launched_at: float
    ended: float
    """The rank's exit (its closing line); a killed rank's last record."""
    closed: bool
    resumed_from: int | None = None
    """The step its first interval started from: the checkpoint it resumed (0 for a fresh start)."""
    last_step: int | None = None
    host_bound_measured: bool = False
    spent: list[Spent] = field(default_factory=list)

    @property
    def wall_seconds(self) -> float:
        return self.ended - self.launched_at


def _paused(entries: tuple[Pause, ...], first_step: int | None) -> list[Spent]:
    """A line's pauses, each at the step it came after (None: unknown)."""
    spent = []
    for entry in entries:
        step = None if first_step is None else first_step + entry.after_steps
        spent.append(Spent(entry.part, entry.seconds, step, step))
    return spent


def segment_times(launch: Launch) -> SegmentTimes | None:
    """One launch of a rank as its times; None where its marker has no launch time (or it has no marker): a
    trainstack that did not measure the breakdown wrote it."""
    if launch.started is None or launch.started.launched_at is None:
        return None
    segment = SegmentTimes(launch.started.launched_at, launch.started.started, False)
    for line in launch.records:
        first = line.first_step
        if segment.resumed_from is None:
            segment.resumed_from = first
        segment.last_step, segment.ended = line.step, line.time
        segment.host_bound_measured |= bool(line.host_bound_measured)
        segment.spent += [Spent(part, seconds, first, line.step) for part, seconds in (line.time_parts or {}).items()]
        segment.spent += _paused(line.pauses, first)
    if launch.ended is not None:
        segment.ended, segment.closed = launch.ended.ended, True
        segment.spent += _paused(launch.ended.paused, segment.last_step)
    return segment


def rank_segments(launches: list[Launch]) -> list[SegmentTimes]:
    """A rank's launches as its segments' times, those that did not measure the breakdown left out."""
    return [segment for launch in launches if (segment := segment_times(launch)) is not None]


def segment_seconds(segment: SegmentTimes, redone_after: int | None) -> dict[str, float]:
    """Seconds per part (every one of PARTS) of the launch's own wall time, the steps after `redone_after` moved to
    lost progress; `other` is the wall time the parts leave over (negative where they count some of it twice).
    The time before the launch (between_segments) is run_breakdown's to add."""
    seconds = dict.fromkeys(PARTS, 0.0)
    for spent in segment.spent:
        lost = spent.seconds * spent.lost_share(redone_after)
        seconds[spent.part] += spent.seconds - lost
        seconds[LOST_PROGRESS] += lost
    seconds[OTHER] = segment.wall_seconds - sum(seconds.values())
    return seconds


def redone_after(segments: list[SegmentTimes]) -> list[int | None]:
    """For each segment, the earliest step a later launch resumed from: its steps after that were trained again."""
    earliest: int | None = None
    thresholds: list[int | None] = []
    for segment in reversed(segments):
        thresholds.append(earliest)
        if segment.resumed_from is not None:
            earliest = segment.resumed_from if earliest is None else min(earliest, segment.resumed_from)
    return thresholds[::-1]


def waited_before(segments: list[SegmentTimes]) -> list[float]:
    """For each segment, the seconds from the previous segment's end to its launch (0 for the first). A rank of a
    requeued job may run on another node than before, whose clock may be behind: a gap below 0 counts as none."""
    gaps = [max(0.0, later.launched_at - earlier.ended) for earlier, later in itertools.pairwise(segments)]
    return [0.0, *gaps] if segments else []


def _totals(wall: float, seconds: dict[str, float]) -> dict:
    return {"wall_seconds": wall, "goodput": seconds[COMPUTE] / wall if wall > 0 else None, "seconds": seconds}


def _summed(rows: list[dict]) -> dict:
    """The rows' wall time and seconds per part added up, and their goodput."""
    return _totals(
        sum(row["wall_seconds"] for row in rows), {part: sum(row["seconds"][part] for row in rows) for part in PARTS}
    )


def run_breakdown(segments_by_rank: dict[int, list[SegmentTimes]]) -> dict | None:
    """summary.json's `time_breakdown`: the whole run, each rank (with its segments) and each segment (its ranks
    summed; the n-th launch of every rank is segment n). A segment's wall time runs from the previous segment's end
    (its own launch, for the first) to its end: the wait before it is its `between_segments`. None when no rank
    measured one."""
    ranks = []
    for rank, segments in sorted(segments_by_rank.items()):
        rows = [
            {
                "segment": number,
                "launched_at": segment.launched_at,
                "ended": "exited" if segment.closed else "killed",
                **_totals(
                    waited + segment.wall_seconds,
                    {**segment_seconds(segment, threshold), BETWEEN_SEGMENTS: waited},
                ),
            }
            for number, (segment, threshold, waited) in enumerate(
                zip(segments, redone_after(segments), waited_before(segments), strict=True)
            )
        ]
        if rows:
            ranks.append(
                {
                    "rank": rank,
                    **_summed(rows),
                    "host_bound_measured": any(s.host_bound_measured for s in segments),
                    "segments": rows,
                }
            )
    if not ranks:
        return None
    launches = max(len(rank["segments"]) for rank in ranks)
    return {
        "parts": list(PARTS),
        **_summed(ranks),
        "ranks": ranks,
        "segments": [
            {"segment": number, **_summed([r["segments"][number] for r in ranks if len(r["segments"]) > number])}
            for number in range(launches)
        ],
    }


def of_run(run_dir: Path) -> dict | None:
    """The breakdown of every rank's records in the run directory (`run_breakdown`)."""
    return run_breakdown({rank: rank_segments(launches) for rank, launches in record.read_run(run_dir).items()})
