"""CPU ranks forked from the agent (the default) against ranks started afresh (TRAINSTACK_FORK_RANKS=0): what a whole
2-rank `trainstack train` launch costs in CPU and in wall time, and how fast its ranks then train.

Launches one after the other, in pairs whose order alternates; a launch's CPU is that of every process of it (the
launcher, the agent, the ranks, their loader workers), from getrusage of this process's children, so load from
other work moves its wall time but hardly its CPU. No target: what forking saves, to know.

    .venv/bin/python bench/rank_start.py [--pairs 4] [--steps 20]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_run import ENV, REPO, train_command

from trainstack.rundir import FORK_RANKS_ENV, RunDir, read_summary

FLAGS = ["--exporter-port", "0", "--no-report"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(steps: int, fork: bool) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, samples/s) of one launch."""
    with tempfile.TemporaryDirectory(prefix="trainstack-bench-") as folder:
        run_dir = Path(folder) / "run"
        command = train_command(run_dir, steps, batch_size=8, num_workers=1, flags=FLAGS)
        cpu, started = children_cpu(), time.monotonic()
        result = subprocess.run(
            command,
            cwd=REPO,
            env={**ENV, FORK_RANKS_ENV: "1" if fork else "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall, cpu = time.monotonic() - started, children_cpu() - cpu
        if result.returncode != 0:
            sys.exit(f"training run failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
        return cpu, wall, read_summary(RunDir(run_dir).summary)["samples_per_second"]


def describe(name: str, runs: list[tuple[float, float, float]]) -> str:
    cpu, wall, speed = (statistics.median(figures) for figures in zip(*runs, strict=True))
    return f"{name:<24}: {cpu:5.1f} CPU-s, {wall:5.1f} s wall, {speed:6.1f} samples/s (medians of {len(runs)})"


def ratio(name: str, forked: list[float], afresh: list[float]) -> str:
    ratios = [a / b for a, b in zip(forked, afresh, strict=True)]
    return (
        f"{name:<12}: {statistics.geometric_mean(ratios):.3f} "
        f"(geometric mean of {len(ratios)} pairs, spread {min(ratios):.3f}-{max(ratios):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    forked, afresh = [], []
    for pair in range(args.pairs):
        for fork in (True, False) if pair % 2 == 0 else (False, True):
            (forked if fork else afresh).append(launch(args.steps, fork))
    print(f"2 CPU ranks, {args.steps} steps a launch, {args.pairs} pairs")
    print(describe("forked from the agent", forked))
    print(describe("started afresh", afresh))
    print("forked / afresh:")
    for index, name in enumerate(("CPU", "wall", "samples/s")):
        print(ratio(name, [run[index] for run in forked], [run[index] for run in afresh]))


if __name__ == "__main__":
    main()
