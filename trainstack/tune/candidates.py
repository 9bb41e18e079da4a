"""Which options to try, from the baseline trial's verdicts: each verdict kind's fixes that trainstack's config has
(train/rank/config.py). A candidate is a set of option overrides; the baseline is always measured beside them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainstack import ceilings
from trainstack.train.rank.config import TrainConfig, _flag  # one spelling of each option's flag


@dataclass(frozen=True)
class Candidate:
    name: str
    options: dict[str, object]
    """TrainConfig field -> value."""

    @property
    def flags(self) -> list[str]:
        flags = []
        for field, value in self.options.items():
            if isinstance(value, bool):
                flags.append(_flag(field) if value else "--no-" + _flag(field)[2:])
            else:
                flags += [_flag(field), str(value)]
        return flags


BASELINE = Candidate("baseline", {})


def _workers(config: TrainConfig) -> list[Candidate]:
    # More workers than cores only queue behind each other: at most two per core the host gives this process.
    cap = 2 * len(os.sched_getaffinity(0))
    counts = sorted(
        {n for n in (max(2, 2 * config.num_workers), max(4, 4 * config.num_workers)) if config.num_workers < n <= cap}
    )
    return [Candidate(f"num_workers={n}", {"num_workers": n}) for n in counts]


def _fewer_allreduces(config: TrainConfig) -> list[Candidate]:
    # Under no_sync the micro-batches before the last skip the all-reduce: one per 2 micro-batches.
    return [Candidate(f"grad_accum={2 * config.grad_accum}", {"grad_accum": 2 * config.grad_accum})]


def _more_work_per_launch(config: TrainConfig) -> list[Candidate]:
    found = [Candidate(f"batch_size={2 * config.batch_size}", {"batch_size": 2 * config.batch_size})]
    if not config.compile:
        found.append(Candidate("compile", {"compile": True}))
    return found


FIXES = {
    ceilings.INPUT_BOUND: _workers,
    ceilings.COMM_BOUND: _fewer_allreduces,
    ceilings.STRAGGLER: _fewer_allreduces,
    ceilings.HOST_BOUND: _more_work_per_launch,
}
"""Verdict kind -> its fixes that the config has (bucket size, prefetch factor, static graph and compression hooks
are not trainstack options: docs/diagnostics.md says how they map onto a user's DataLoader and DDP)."""


def for_verdicts(kinds: list[str], config: TrainConfig) -> list[Candidate]:
    """The fixes of every verdict; a healthy baseline still gets one more loader worker: a check that nothing is
    left to gain, which must come out even."""
    found: dict[str, Candidate] = {}
    for kind in kinds or [ceilings.INPUT_BOUND]:
        for candidate in FIXES.get(kind, lambda _: [])(config)[: None if kinds else 1]:
            found.setdefault(candidate.name, candidate)
    return list(found.values())
