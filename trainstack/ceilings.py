"""How much a verdict's fix can gain at most: the speedup that removing the time it names would bring.

One definition for every verdict that has a time share: a fix that removes a share s of the time can make it at most
1 / (1 - s) times faster (Amdahl's law with the rest unchanged). A loader that starves the device 12% of the step
time caps the gain of a faster loader at 1.14x; exposed communication at 40% caps a faster link at 1.67x. A ceiling
is an upper bound: the fix may remove less, and the parts it leaves may not shrink with it.

Each kind's share is read once (`SHARES`), from the ranks' shares over the window judged: a finished run's steady
window (trainstack/record.py; what its verdicts, summary.json's `ceilings` and the report state, so each kind has one
ceiling per run) or a live snapshot's (diagnose). Which share each verdict kind reads:

- input-bound: the most starved rank's data starvation over its step time (in DDP every rank waits for it);
- comm-bound: the least exposed rank's exposed communication over its step time (a straggler's peers wait in the
  all-reduce too, the straggler does not: only what every rank waits is the link's);
- host-bound: the most host-bound rank's idle time over its step time;
- straggler: what the other ranks wait beyond the least-waiting rank at the collectives (ratios.STRAGGLER_WAIT, the
  straggler verdict's own figure: the most any rank waits a step less the straggler's own wait, over the longest
  step);
- pauses: evaluation and checkpoint save and load over the wall time of every launch and the time between them
  (goodput's ceiling: a loop that never paused), from the time breakdown (trainstack/breakdown.py), which accounts
  for that wall time: a requeued job's wait in the queue is in the time, and no fix of the loop removes it.

Nothing here imports torch or monitoring/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from trainstack import breakdown, ratios, window
from trainstack.problems import COMM_BOUND, HOST_BOUND, INPUT_BOUND, PAUSES, STRAGGLER, WHAT_FIX_GAINS

PAUSE_PARTS = (breakdown.EVALUATION, breakdown.CHECKPOINT_SAVE, breakdown.CHECKPOINT_LOAD)


def speedup_ceiling(share: float) -> float:
    """The speedup a fix removing `share` (0 <= share < 1) of the time brings at most: 1 / (1 - share)."""
    if not 0 <= share < 1:
        raise ValueError(f"a share of the time is in [0, 1), got {share}")
    return 1 / (1 - share)


@dataclass(frozen=True)
class Ceiling:
    kind: str
    """The verdict kind whose fix it caps (diagnose's `kind`, or `pauses`)."""
    share: float
    speedup: float
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


def ceiling(kind: str, share: float) -> Ceiling:
    share = max(0.0, share)  # a difference of noisy shares can dip below 0: nothing to gain
    speedup = speedup_ceiling(share)
    what, fix = WHAT_FIX_GAINS[kind]
    text = (
        f"{kind}: {what.format(share=f'{100 * share:.0f}%')}; {fix} makes "
        f"{'the run' if kind == PAUSES else 'steps'} up to {speedup:.2f}x faster"
    )
    return Ceiling(kind, share, speedup, text)


class RankShares(Protocol):
    """A rank's shares of step time over the window judged: a finished run's steady window (window.RankWindow) or a
    live snapshot's rate window (diagnose's RankView). None: not measured."""

    @property
    def data_wait_ratio(self) -> float | None: ...
    @property
    def host_bound_ratio(self) -> float | None: ...
    @property
    def comm_exposed_ratio(self) -> float | None: ...
    @property
    def step_seconds(self) -> float | None: ...


def input_bound_share(ranks: Sequence[RankShares]) -> float | None:
    return max((r.data_wait_ratio for r in ranks if r.data_wait_ratio is not None), default=None)


def host_bound_share(ranks: Sequence[RankShares]) -> float | None:
    return max((r.host_bound_ratio for r in ranks if r.host_bound_ratio is not None), default=None)


def comm_bound_share(ranks: Sequence[RankShares]) -> float | None:
    """None unless every rank measured its exposed communication."""
    exposed = [r.comm_exposed_ratio for r in ranks]
    return min(share for share in exposed if share is not None) if ranks and None not in exposed else None


def straggler_share(ranks: Sequence[RankShares]) -> float | None:
    """What the others wait beyond the straggler (ratios.STRAGGLER_WAIT), the most any rank's wait is beyond."""
    waits = {str(index): r.comm_exposed_ratio for index, r in enumerate(ranks) if r.comm_exposed_ratio is not None}
    steps = {str(index): r.step_seconds for index, r in enumerate(ranks) if r.step_seconds is not None}
    return max(ratios.STRAGGLER_WAIT.of(waits, steps).values(), default=None)


SHARES = {
    INPUT_BOUND: input_bound_share,
    COMM_BOUND: comm_bound_share,
    HOST_BOUND: host_bound_share,
    STRAGGLER: straggler_share,
}
"""Each verdict kind with a share of step time -> how its share reads from the ranks' shares."""


def of_ranks(ranks: Sequence[RankShares]) -> dict[str, Ceiling]:
    """kind -> its ceiling, for every kind whose share the ranks measure: the ceiling each verdict carries, and
    summary.json's `ceilings` (with the pauses'). A share of 1 (a rank that only waited) has no finite ceiling:
    capped just below it."""
    return {
        kind: ceiling(kind, min(share, 0.99)) for kind, read in SHARES.items() if (share := read(ranks)) is not None
    }


def of_pauses(times: dict | None) -> dict[str, Ceiling]:
    """The pauses' ceiling from a run's `time_breakdown` (breakdown.run_breakdown): evaluation and checkpoints over
    the wall time it accounts for (every launch, and the time between segments); {} without one."""
    if not times or not times["wall_seconds"] > 0:
        return {}
    paused = sum(times["seconds"][part] for part in PAUSE_PARTS)
    return {PAUSES: ceiling(PAUSES, paused / times["wall_seconds"])}


def of_run(run_dir: Path, times: dict | None) -> dict[str, Ceiling]:
    """A finished run's ceilings: each verdict kind's over the steady window (trainstack/record.py), the same its
    verdicts carry, and the pauses' over its time breakdown."""
    return {**of_ranks(window.of_run(run_dir)), **of_pauses(times)}


def as_json(found: dict[str, Ceiling]) -> dict[str, dict]:
    """summary.json's `ceilings`: kind -> {kind, share, speedup, text}."""
    return {kind: found[kind].to_dict() for kind in found}
