"""Which options to try, from the baseline trial's verdicts: each verdict kind's fixes that trainstack's config has
(train/rank/config.py). A candidate is a set of option overrides; the baseline is always measured beside them."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from trainstack import problems
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


def _switch(field: str) -> Candidate:
    """A boolean option the baseline has off, on."""
    return Candidate(field, {field: True})


def _loader(config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    # More workers than cores only queue behind each other: at most two per core the host gives this process.
    cap = 2 * len(os.sched_getaffinity(0))
    counts = sorted(
        {n for n in (max(2, 2 * config.num_workers), max(4, 4 * config.num_workers)) if config.num_workers < n <= cap}
    )
    found = [Candidate(f"num_workers={n}", {"num_workers": n}) for n in counts]
    if config.num_workers:  # workers that keep more batches ready ride out a slow one
        found.append(
            Candidate(f"prefetch_factor={2 * config.prefetch_factor}", {"prefetch_factor": 2 * config.prefetch_factor})
        )
    if on_cuda and not config.pin_memory:  # pinning helps only a copy to a GPU
        found.append(_switch("pin_memory"))
    if config.num_workers and not config.persistent_workers:
        found.append(_switch("persistent_workers"))
    return found


def _fewer_allreduces(config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    # Under no_sync the micro-batches before the last skip the all-reduce: one per 2 micro-batches. DDP's static
    # graph cannot start under no_sync (train/rank/config.py refuses the pair).
    if config.ddp_static_graph:
        return []
    return [Candidate(f"grad_accum={2 * config.grad_accum}", {"grad_accum": 2 * config.grad_accum})]


def _cheaper_allreduces(config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    """DDP's own options: buckets 4x larger (fewer all-reduces, each better at using the link), the static graph
    (less bookkeeping per step; not with accumulation), bf16 compression (half the bytes; DDP allows it over NCCL
    only, so on CUDA ranks only). FSDP has none of them."""
    if config.strategy != "ddp":
        return []
    bucket = 4 * config.ddp_bucket_cap_mb
    found = [Candidate(f"ddp_bucket_cap_mb={bucket}", {"ddp_bucket_cap_mb": bucket})]
    if not config.ddp_static_graph and config.grad_accum == 1:
        found.append(_switch("ddp_static_graph"))
    if on_cuda and config.ddp_comm_hook == "none":
        found.append(Candidate("ddp_comm_hook=bf16", {"ddp_comm_hook": "bf16"}))
    return found


def _comm(config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    return _fewer_allreduces(config, on_cuda) + _cheaper_allreduces(config, on_cuda)


def _more_work_per_launch(config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    found = [Candidate(f"batch_size={2 * config.batch_size}", {"batch_size": 2 * config.batch_size})]
    if not config.compile:
        found.append(Candidate("compile", {"compile": True}))
    return found


FIXES: dict[str, Callable[[TrainConfig, bool], list[Candidate]]] = {
    problems.INPUT_BOUND: _loader,
    problems.COMM_BOUND: _comm,
    problems.STRAGGLER: _fewer_allreduces,  # a slow rank holds up each all-reduce: fewer of them, fewer waits
    problems.HOST_BOUND: _more_work_per_launch,
}
"""Verdict kind -> its fixes, each an option of the config (docs/training.md maps them onto a user's own DataLoader
and DDP arguments). Each candidate changes one option of the baseline's, and only where it changes something: one
of the options its problem's `tune` lists (trainstack/problems.py; tests/unit/trainstack/test_problems.py checks the two agree)."""


def for_verdicts(kinds: list[str], config: TrainConfig, on_cuda: bool) -> list[Candidate]:
    """The fixes of every verdict; a healthy baseline still gets the loader's first fix (twice the workers, or
    twice the prefetch where the workers are at their cap): a check that nothing is left to gain, which must come
    out even. on_cuda: whether the trials' ranks run on CUDA GPUs."""
    found: dict[str, Candidate] = {}
    for kind in kinds or [problems.INPUT_BOUND]:
        for candidate in FIXES.get(kind, lambda *_: [])(config, on_cuda)[: None if kinds else 1]:
            found.setdefault(candidate.name, candidate)
    return list(found.values())
