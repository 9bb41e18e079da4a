"""trainstack's loop against the minimal Accelerate loop: same model, data, batch, 2 CPU ranks, one run.

Prints steps/s for each (median of alternating repeats) and their ratio. Target: trainstack >= 0.98 x minimal.
trainstack's steps are timed from its own telemetry records (rank 0), after the same warm-up, so start-up,
final checkpoint and evaluation are outside both timings.

    .venv/bin/python bench/train_overhead.py [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
       "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // 2))}


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def minimal(steps: int, warmup: int, batch: int, workers: int) -> float:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--main_process_port", str(_port()), "bench/minimal_loop.py", "--steps", str(steps),
               "--warmup", str(warmup), "--batch-size", str(batch), "--num-workers", str(workers)]
    out = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, check=True).stdout
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return result["steps"] / result["seconds"]


def trainstack(steps: int, warmup: int, batch: int, workers: int, log_every: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "train.cli", "train", "--output-dir", str(run_dir), "--max-steps",
                        str(steps), "--batch-size", str(batch), "--num-workers", str(workers), "--log-every",
                        str(log_every), "--checkpoint-every", "0", "--exporter-port", "0"],
                       cwd=REPO, env=ENV, capture_output=True, text=True, check=True)
        records = [json.loads(line) for line in (run_dir / "telemetry/rank-0.jsonl").read_text().splitlines()]
        timed = [s for r in records if r["step"] > warmup for s in r["step_seconds"]]
        # step_seconds holds one entry per step; the records past warm-up cover exactly steps - warmup steps.
        return len(timed) / sum(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="steps excluded from timing (a multiple of 10)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reference, ours = [], []
    for repeat in range(args.repeats):  # alternate, so drift in machine load hits both sides alike
        reference.append(minimal(args.steps, args.warmup, args.batch_size, args.num_workers))
        ours.append(trainstack(args.steps, args.warmup, args.batch_size, args.num_workers, 10))
        print(f"repeat {repeat + 1}: minimal {reference[-1]:.2f} steps/s, trainstack {ours[-1]:.2f} steps/s",
              flush=True)
    ratio = statistics.median(ours) / statistics.median(reference)
    print(f"minimal Accelerate loop : {statistics.median(reference):.2f} steps/s (median of {args.repeats})")
    print(f"trainstack train        : {statistics.median(ours):.2f} steps/s (median of {args.repeats})")
    print(f"ratio trainstack/minimal: {ratio:.3f}  (target >= 0.98)")


if __name__ == "__main__":
    main()
