"""Each verdict's ceiling from a live snapshot: the shares the verdicts judge, through trainstack.ceilings' one
definition (speedup at most 1 / (1 - share)). Attached to the verdicts by kind, beside them, so the verdicts' own
texts stay as they are."""

from __future__ import annotations

from trainstack import ceilings
from trainstack.ceilings import Ceiling
from trainstack.monitoring.diagnose.snapshot import Snapshot


def of_snapshot(snapshot: Snapshot) -> dict[str, Ceiling]:
    """kind -> its ceiling, for every kind whose share the snapshot measures (the same ranks the verdicts judge)."""
    ranks = snapshot.ranks
    shares = {
        ceilings.INPUT_BOUND: max((r.data_wait_ratio for r in ranks if r.data_wait_ratio is not None), default=None),
        ceilings.HOST_BOUND: max((r.host_bound_ratio for r in ranks if r.host_bound_ratio is not None), default=None),
        ceilings.STRAGGLER: max(snapshot.straggler_waits().values(), default=None),
    }
    exposed = [r.comm_exposed_ratio for r in ranks if r.comm_exposed_ratio is not None]
    if ranks and len(exposed) == len(ranks):
        shares[ceilings.COMM_BOUND] = min(exposed)
    # A share of 1 (a rank that only waited) has no finite ceiling: capped just below it.
    return {kind: ceilings.ceiling(kind, min(share, 0.99)) for kind, share in shares.items() if share is not None}
