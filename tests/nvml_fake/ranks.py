"""Stand-in ranks for exporter tests and benchmarks, the other input of the exporter besides NVML.

Each stand-in is a short process that writes the training metrics of docs/architecture.md into a prometheus_client
multiprocess directory the way train/telemetry.py does (same names, labels and gauge mode), then exits, leaving its
`<type>_<pid>.db` files behind as a finished rank does. No torch, no training: a fraction of a second each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)  # train/telemetry.py's


def write_rank(metrics_dir: Path, rank: int, steps: int, on_gpu: bool = False, world_size: int = 2) -> int:
    """Run one stand-in rank that has done `steps` steps; returns its pid, the one in its file names.
    `on_gpu` adds the metrics a rank has only on a GPU (peak memory, MFU)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.nvml_fake.ranks", str(rank), str(steps), str(world_size),
               "gpu" if on_gpu else "cpu"]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    if process.wait() != 0:
        raise RuntimeError(f"stand-in rank {rank} failed with exit code {process.returncode}")
    return process.pid


def _write(rank: str, steps: int, world_size: str, on_gpu: bool) -> None:
    # Imported here: prometheus_client picks its multiprocess mode from the environment when imported.
    from prometheus_client import Counter, Gauge, Histogram

    def counter(name: str):
        return Counter(name, name, ["rank"]).labels(rank)

    def gauge(name: str, labels=("rank",)):
        return Gauge(name, name, list(labels), multiprocess_mode="mostrecent")

    counter("trainstack_train_steps").inc(steps)
    counter("trainstack_train_samples").inc(8 * steps)
    counter("trainstack_train_tokens").inc(512 * steps)
    counter("trainstack_train_forward_seconds").inc(0.02 * steps)
    counter("trainstack_train_data_wait_seconds").inc(0.01 * steps)
    step = Histogram("trainstack_train_step_duration_seconds", "step", ["rank"], buckets=STEP_BUCKETS).labels(rank)
    for i in range(steps):
        step.observe(0.02 * (1 + i % 7))
    now = time.time()
    values = {"loss": 2.5, "learning_rate": 3e-4, "last_step_timestamp_seconds": now, "epoch": 0,
              "last_checkpoint_timestamp_seconds": now, "checkpoint_duration_seconds": 0.2}
    if on_gpu:
        values |= {"memory_allocated_peak_bytes": 61 << 30, "memory_reserved_peak_bytes": 64 << 30, "mfu_ratio": 0.41}
    for name, value in values.items():
        gauge(f"trainstack_train_{name}").labels(rank).set(value)
    gauge("trainstack_train_rank_info", ("rank", "local_rank", "node", "uuid")).labels(rank, rank, "0", "").set(1)
    gauge("trainstack_train_run_info", ("rank", "run_id", "world_size", "nodes", "mixed_precision", "model",
                                        "dataset")).labels(
        rank, "stand-in-run", world_size, "1", "bf16" if on_gpu else "no", "builtin:tiny-gpt", "builtin:sequences",
    ).set(1)


if __name__ == "__main__":
    _write(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "gpu")
