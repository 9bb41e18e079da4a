"""trainstack's loop against the minimal Accelerate loop: same model, data and batch, 2 CPU ranks each.

The two train side by side, one half of the CPUs each (bench/side_by_side.py), for the same number of steps;
both are timed over the steps after the same warm-up, so start-up, the final checkpoint and evaluation are
outside both timings. trainstack is `trainstack train` as a user runs it (telemetry on, loss reduced every 10
steps, exporter off); the reference is bench/minimal_loop.py. Target (issue 2): trainstack/minimal >= 0.98.

    .venv/bin/python bench/train_overhead.py [--steps 300] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import halves_for_pair, pinned, report
from train_run import train_command

from trainstack import record
from trainstack.rundir import RunDir, free_port

REPO = Path(__file__).resolve().parent.parent
ENV = {
    **os.environ,
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TQDM_DISABLE": "1",
    "ACCELERATE_USE_CPU": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": str(REPO),
}
TARGET = 0.98


def minimal_command(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        "bench/minimal_loop.py",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch-size",
        str(args.batch_size),
        "--num-workers",
        str(args.num_workers),
    ]


def trainstack_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return train_command(
        run_dir, args.steps, args.batch_size, args.num_workers, ["--exporter-port", "0", "--no-report"]
    )


def trainstack_rate(run_dir: Path, warmup: int) -> float:
    records = record.records(record.read_launches(RunDir(run_dir).rank_records(0)))
    timed = [seconds for interval in records if interval.step > warmup for seconds in interval.step_seconds]
    return len(timed) / sum(timed)


def minimal_rate(stdout: str) -> float:
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    return result["steps"] / result["seconds"]


def finish(process: subprocess.Popen, what: str) -> str:
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        sys.exit(f"{what} failed (exit {process.returncode}):\n{stderr[-4000:]}")
    return stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of the timing (a multiple of 10)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4, help="pairs (the CPU halves swap each time)")
    args = parser.parse_args()
    ours, theirs = [], []
    for pair in range(args.repeats):
        our_cpus, their_cpus = halves_for_pair(pair)
        with tempfile.TemporaryDirectory(prefix="train-overhead-") as tmp:
            run_dir = Path(tmp) / "run"
            launch = dict(cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            trainstack = subprocess.Popen(pinned(trainstack_command(args, run_dir), our_cpus), **launch)
            minimal = subprocess.Popen(pinned(minimal_command(args), their_cpus), **launch)
            theirs.append(minimal_rate(finish(minimal, "the minimal loop")))
            finish(trainstack, "trainstack train")
            ours.append(trainstack_rate(run_dir, args.warmup))
        print(
            f"pair {pair + 1}: trainstack {ours[-1]:.3f} steps/s (CPUs {sorted(our_cpus)}), minimal "
            f"{theirs[-1]:.3f} steps/s (CPUs {sorted(their_cpus)}), ratio {ours[-1] / theirs[-1]:.3f}",
            flush=True,
        )
    print(report("trainstack train", "minimal Accelerate loop", ours, theirs, TARGET))


if __name__ == "__main__":
    main()
