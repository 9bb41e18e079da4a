"""How much a verdict's fix can gain at most: the speedup that removing the time it names would bring.

One definition for every verdict that has a time share: a fix that removes a share s of the time can make it at most
1 / (1 - s) times faster (Amdahl's law with the rest unchanged). A loader that starves the device 12% of the step
time caps the gain of a faster loader at 1.14x; exposed communication at 40% caps a faster link at 1.67x. A ceiling
is an upper bound: the fix may remove less, and the parts it leaves may not shrink with it.

The shares come from the time breakdown (trainstack/breakdown.py; summary.json's `time_breakdown`), which `train`
runs and watched runs with trainstack.monitor both record, or from a live snapshot (diagnose). Which share each verdict
kind reads:

- input-bound: the most starved rank's data starvation over its step time (in DDP every rank waits for it);
- comm-bound: the least exposed rank's exposed communication over its step time (a straggler's peers wait in the
  all-reduce too, the straggler does not: only what every rank waits is the link's);
- host-bound: the most host-bound rank's idle time over its step time;
- straggler: what the other ranks wait beyond the least-waiting rank at the collectives (ratios.STRAGGLER_WAIT, the
  straggler verdict's own figure: the most any rank waits less the straggler's own wait);
- pauses: evaluation and checkpoint save and load over the wall time (goodput's ceiling: a loop that never paused).

Nothing here imports torch or monitoring/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainstack import breakdown, ratios
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


def straggler_share(waits: dict) -> float | None:
    """The straggler's cost as a share of step time from each rank's wait share: what the others wait beyond it."""
    beyond = ratios.STRAGGLER_WAIT.of(waits)
    return max(beyond.values()) if beyond else None


def _step_shares(rank: dict) -> dict[str, float] | None:
    """A rank's step parts as shares of its steps' time (breakdown.STEP_PARTS); None without steps."""
    seconds = rank["seconds"]
    steps = sum(seconds[part] for part in breakdown.STEP_PARTS)
    return {part: seconds[part] / steps for part in breakdown.STEP_PARTS} if steps > 0 else None


def from_breakdown(times: dict | None) -> dict[str, Ceiling]:
    """Each verdict kind's ceiling from a run's `time_breakdown` (breakdown.run_breakdown); kinds whose share is
    not measured are left out (host-bound on CPU ranks, straggler with one rank)."""
    if not times:
        return {}
    ranks = [shares for rank in times["ranks"] if (shares := _step_shares(rank)) is not None]
    found: dict[str, Ceiling] = {}
    if ranks:
        found[INPUT_BOUND] = ceiling(INPUT_BOUND, max(r[breakdown.DATA_STARVATION] for r in ranks))
        if len(ranks) > 1:
            exposed = [r[breakdown.COMM_EXPOSED] for r in ranks]
            found[COMM_BOUND] = ceiling(COMM_BOUND, min(exposed))
            if (share := straggler_share(dict(enumerate(exposed)))) is not None:
                found[STRAGGLER] = ceiling(STRAGGLER, share)
        if any(rank["host_bound_measured"] for rank in times["ranks"]):
            found[HOST_BOUND] = ceiling(HOST_BOUND, max(r[breakdown.HOST_BOUND] for r in ranks))
    if times["wall_seconds"] > 0:
        paused = sum(times["seconds"][part] for part in PAUSE_PARTS)
        found[PAUSES] = ceiling(PAUSES, paused / times["wall_seconds"])
    return found


def as_json(found: dict[str, Ceiling]) -> dict[str, dict]:
    """summary.json's `ceilings`: kind -> {kind, share, speedup, text}."""
    return {kind: found[kind].to_dict() for kind in found}
