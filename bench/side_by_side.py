"""Measuring two variants fairly on a small, shared machine: run them at the same time, each pinned to its own
half of the CPUs, swap the halves at every pair, and take the geometric mean of the per-pair ratios. Whatever
else loads the machine loads both alike, and a faster half's advantage cancels out across the swaps. (Run one
after the other, the same command's speed drifted by 0.8x-1.7x here.)"""

from __future__ import annotations

import os
import statistics
import sys


def cpu_halves() -> tuple[set[int], set[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs at least 2 CPUs: the two variants run side by side, one half of the CPUs each")
    return set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2 :])


def halves_for_pair(pair: int) -> tuple[set[int], set[int]]:
    """(CPUs for the variant under test, CPUs for the reference), swapped on every other pair."""
    first, second = cpu_halves()
    return (first, second) if pair % 2 == 0 else (second, first)


def pinned(command: list[str], cpus: set[int]) -> list[str]:
    # taskset, not preexec_fn: the caller may have threads running, and forking with threads is unsafe there.
    return ["taskset", "--cpu-list", ",".join(map(str, sorted(cpus))), *command]


def report(name: str, reference: str, ours: list[float], theirs: list[float], target: float | None) -> str:
    """target None: a comparison to know, not a requirement."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    ratio = statistics.geometric_mean(ratios)
    verdict = "" if target is None else f"; target >= {target}: {'met' if ratio >= target else 'MISSED'}"
    return (
        f"{name:<26}: {statistics.median(ours):.3f} steps/s (median of {len(ours)})\n"
        f"{reference:<26}: {statistics.median(theirs):.3f} steps/s (median of {len(theirs)})\n"
        f"ratio: {ratio:.3f} (geometric mean of {len(ratios)} pairs, spread {min(ratios):.3f}-{max(ratios):.3f})"
        + verdict
    )
