"""Stand-in ranks for exporter tests and benchmarks, the other input of the exporter besides NVML.

Each stand-in is a short process that writes the training metrics into a prometheus_client multiprocess directory
the way trainstack/telemetry/ does (both build them from trainstack/catalog.py: same names, labels and gauge mode),
then exits, leaving its `<type>_<pid>.db` files behind as a finished rank does. No torch, no training: a fraction
of a second each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from trainstack import catalog

REPO = Path(__file__).resolve().parent.parent


def write_rank(metrics_dir: Path, rank: int, steps: int, on_gpu: bool = False, world_size: int = 2) -> int:
    """Run one stand-in rank that has done `steps` steps; returns its pid, the one in its file names.
    `on_gpu` adds the metrics a rank has only on a GPU (peak memory, MFU)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "bench.standin_ranks",
        str(rank),
        str(steps),
        str(world_size),
        "gpu" if on_gpu else "cpu",
    ]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    if process.wait() != 0:
        raise RuntimeError(f"stand-in rank {rank} failed with exit code {process.returncode}")
    return process.pid


def _write(rank: str, steps: int, world_size: str, on_gpu: bool) -> None:
    def series(metric: catalog.Metric):
        return catalog.rank_metric(metric).labels(rank)

    series(catalog.TRAIN_STEPS).inc(steps)
    series(catalog.TRAIN_SAMPLES).inc(8 * steps)
    series(catalog.TRAIN_TOKENS).inc(512 * steps)
    series(catalog.TRAIN_FORWARD_SECONDS).inc(0.02 * steps)
    series(catalog.TRAIN_DATA_WAIT).inc(0.01 * steps)
    series(catalog.TRAIN_COMM_SECONDS).inc(0.03 * steps)
    series(catalog.TRAIN_COMM_EXPOSED).inc(0.005 * steps)
    series(catalog.TRAIN_COMM_BYTES).inc((2 << 20) * steps)
    step = series(catalog.TRAIN_STEP_DURATION)
    for i in range(steps):
        step.observe(0.02 * (1 + i % 7))
    per_step = {
        "compute": 0.06,
        "comm_exposed": 0.005,
        "data_starvation": 0.01,
        "checkpoint_save": 0.002,
        "evaluation": 0.002,
        "checkpoint_load": 0.0,
        "compile": 0.0,
        "startup": 0.0,
        **({"host_bound": 0.003} if on_gpu else {}),
    }  # a CPU rank does not measure host-bound idle
    time_by_part = catalog.rank_metric(catalog.TRAIN_TIME)
    for part, seconds in per_step.items():
        time_by_part.labels(rank, part).inc(seconds * steps)
    now = time.time()
    values = {
        catalog.TRAIN_LOSS: 2.5,
        catalog.TRAIN_LEARNING_RATE: 3e-4,
        catalog.TRAIN_LAST_STEP: now,
        catalog.TRAIN_EPOCH: 0,
        catalog.TRAIN_LAST_CHECKPOINT: now,
        catalog.TRAIN_CHECKPOINT_DURATION: 0.2,
    }
    if on_gpu:
        values |= {
            catalog.TRAIN_MEMORY_ALLOCATED_PEAK: 61 << 30,
            catalog.TRAIN_MEMORY_RESERVED_PEAK: 64 << 30,
            catalog.TRAIN_MFU: 0.41,
        }
    for metric, value in values.items():
        series(metric).set(value)
    catalog.rank_metric(catalog.TRAIN_RANK_INFO).labels(rank=rank, local_rank=rank, node="0", uuid="").set(1)
    catalog.rank_metric(catalog.TRAIN_RUN_INFO).labels(
        rank=rank,
        run_id="stand-in-run",
        world_size=world_size,
        nodes="1",
        mixed_precision="bf16" if on_gpu else "no",
        model="builtin:tiny-gpt",
        dataset="builtin:sequences",
        clock="gpu" if on_gpu else "host",
        strategy="ddp",
        launcher="train",
    ).set(1)


if __name__ == "__main__":
    _write(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "gpu")
