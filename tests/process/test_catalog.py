"""The metric catalog (trainstack/catalog.py) against everything that names a metric.

Readers: every metric a recording rule, alert, rule unit test, dashboard query or variable, `trainstack diagnose`
or the NVML fake's stand-in ranks names is in the catalog, and each entry's `readers` are exactly the rules,
panels, variables and diagnose modules that read it. Producers: every metric in the catalog is produced, checked
on a live scrape of an exporter process on the NVML fake (the `dgx_h100` host, plus a T4 whose unsupported fields
make NVML errors) reading the files of a rank that trainer's own telemetry code wrote. Metrics that exist only
under a condition are produced by meeting the condition, never by declaring them present:
- CUDA-only gauges (peak memory) and the GPU timeline: the telemetry runs with device "cuda" on a fake CUDA
  clock and fake memory figures (torch.cuda.Event and max_memory_* stood in, as tests/unit/trainstack/test_timeline.py
  does); `test_cuda_telemetry_writes_its_gpu_only_gauges` runs the same on a real GPU;
- MFU: the telemetry is given a known peak FLOP/s, as peak_flops() gives a known GPU;
- parameter, gradient and optimizer-state bytes (per shard under FSDP): the state_measured() call the loop makes
  after the first optimizer step; compile time and recompiles: the step_compiled() call a compiling step makes;
- Xid errors, per-process memory, PCIe throughput, NVML errors: the fake host raises an Xid, lists the rank's pid
  on a GPU, the exporter runs with --pcie-throughput, and the T4 lacks fields.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.standin_ranks import write_rank
from tests.helpers.catalog import SAMPLES, unknown
from tests.helpers.runs import REPO, stop_process
from tests.helpers.scrapes import scrape
from trainstack import catalog
from trainstack.commands.watch import CommandState
from trainstack.metric_files import merged_metrics
from trainstack.rundir import RunDir, free_port

DEADLINE_SECONDS = 120  # a limit on waiting for a loaded machine, never a measured speed
# Subprocesses import from this checkout, and from whatever else PYTHONPATH names (the GPU machine's wheels).
PYTHONPATH = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))


@pytest.mark.slow
def test_the_metrics_docs_are_generated_from_the_catalog():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/metrics-docs.py"), "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def exposed(samples) -> dict[str, set[frozenset[str]]]:
    """sample name -> the label-name sets its series carry."""
    found: dict[str, set[frozenset[str]]] = {}
    for sample in samples:
        found.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return found


def labels_wrong(found: dict[str, set[frozenset[str]]]) -> list[str]:
    wrong = []
    for name, label_sets in found.items():
        metric = SAMPLES[name]
        expected = frozenset(metric.labels) | ({"le"} if name.endswith("_bucket") else set())
        wrong += [
            f"{name}: labels {sorted(labels)}, the catalog says {sorted(expected)}"
            for labels in label_sets
            if labels != expected
        ]
    return wrong


@pytest.mark.slow
@pytest.mark.parametrize("on_gpu", [False, True])
def test_the_stand_in_ranks_write_catalog_metrics(tmp_path, on_gpu):
    write_rank(tmp_path, rank=0, steps=3, on_gpu=on_gpu)
    found = exposed(sample for family in merged_metrics(tmp_path) for sample in family.samples)
    assert not unknown(set(found)), "bench/standin_ranks.py writes metrics trainstack/catalog.py lacks"
    assert not labels_wrong(found)


# One rank's telemetry as the trainer drives it, with a known peak FLOP/s, on a "cuda" device: every training metric
# a GPU rank writes. `fake-cuda` stands in CUDA's events and memory figures (a fake GPU clock, as
# tests/unit/trainstack/test_timeline.py's); `cuda` is a real GPU. The process exits, leaving its files, as a rank does.
TELEMETRY_RANK = """
import sys, time
from pathlib import Path
import torch
from trainstack.monitor import Monitor
from trainstack.telemetry.device import RankIdentity

if sys.argv[3] == "fake-cuda":
    from tests.helpers.fakes import FakeGpu
    gpu = FakeGpu()
    torch.cuda.Event = lambda enable_timing: gpu.new_event()
    torch.cuda.max_memory_allocated = lambda device: 61 << 30
    torch.cuda.max_memory_reserved = lambda device: 64 << 30
    load, compute, drain = gpu.host_works, gpu.queue, gpu.drain
else:
    load, drain = time.sleep, torch.cuda.synchronize
    def compute(seconds):
        torch.ones(1024, 1024, device="cuda").sum()
identity = RankIdentity(rank=0, local_rank=0, node="node0", uuid=sys.argv[2], run_id="catalog", world_size=1,
                        nodes=1, mixed_precision="bf16", model="builtin:tiny-gpt", dataset="builtin:sequences")
monitor = Monitor(Path(sys.argv[1]), identity, flops_per_token=6e6, peak=1e12, device=torch.device("cuda"))
monitor.step(8, compile_seconds=2.0, recompiles=1)
# A real one-process DDP model on gloo (a file store, no network): its all-reduce hook times the gradient buckets.
torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(sys.argv[1] + ".store", 1), rank=0,
                                     world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
assert monitor.watch(ddp)
for _ in range(3):
    monitor.data_wait_started()
    load(0.01)
    monitor.data_ready()
    monitor.forward_started()
    compute(0.02)
    monitor.forward_done()
    compute(0.04)
    ddp(torch.ones(2, 4)).sum().backward()
    monitor.step(8, tokens=8 * 64, loss=2.5, lr=3e-4)
monitor._state_measured({"param_bytes": 1000, "grad_bytes": 1000, "optimizer_state_bytes": 2000})
drain()
monitor.flush()
with monitor.pause("checkpoint_save"):
    load(0.01)
monitor.close()
torch.distributed.destroy_process_group()
"""


def run_telemetry_rank(tmp_path: Path, metrics_dir: Path, device: str) -> None:
    metrics_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONPATH": PYTHONPATH}
    rank = subprocess.run(
        [sys.executable, "-c", TELEMETRY_RANK, str(tmp_path / "run"), "GPU-catalog", device],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rank.returncode == 0, rank.stderr[-3000:]


def fake_host(rank_pid: int) -> dict:
    """dgx_h100 with a T4 added (its missing HBM sensor and NVLink make NVML errors), the rank on GPU 0, an Xid."""
    host = json.loads((REPO / "monitoring/nvml_fake/hosts/dgx_h100.json").read_text())
    t4 = next(
        gpu
        for gpu in json.loads((REPO / "monitoring/nvml_fake/hosts/mixed.json").read_text())["gpus"]
        if gpu["model"] == "t4"
    )
    host["gpus"].append(t4)
    host["processes"] = {"0": [{"pid": rank_pid, "used_gpu_memory": 1 << 30}]}
    host["xid_events"] = [{"gpu": 1, "xid": 79, "after_seconds": 0}]
    return host


@pytest.mark.slow
def test_every_catalog_metric_is_produced_and_nothing_else(tmp_path):
    metrics_dir = tmp_path / "metrics"
    run_telemetry_rank(tmp_path, metrics_dir, "fake-cuda")
    rank_pid = int(next(metrics_dir.glob("counter_*.db")).stem.rpartition("_")[2])
    CommandState(metrics_dir, ["torchrun", "train.py"], "catalog").running(3)  # what trainstack watch writes
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps(fake_host(rank_pid)))
    stall = RunDir(tmp_path / "run").stall(1)  # what the launcher collects when no rank steps
    stall.path.mkdir(parents=True)
    stall.verdict.write_text(json.dumps({"headline": "rank 1 has not joined all_reduce #3", "culprits": [1]}))
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainstack.monitoring.exporter",
            "--nvml-module",
            "trainstack.monitoring.nvml_fake",
            "--port",
            str(port),
            "--run-dir",
            str(tmp_path / "run"),
            "--metrics-dir",
            str(metrics_dir),
            "--pcie-throughput",
        ],
        cwd=REPO,
        env={**os.environ, "NVML_FAKE_HOST": str(host_file), "PYTHONPATH": PYTHONPATH},
    )
    wanted = set(SAMPLES)
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        found = exposed(scrape(port) or [])
        while set(found) != wanted and time.monotonic() < deadline:
            time.sleep(0.5)
            found = exposed(scrape(port) or [])
    finally:
        stop_process(exporter)
    assert not unknown(set(found)), "the exporter serves metrics trainstack/catalog.py lacks"
    assert not wanted - set(found), (
        "in trainstack/catalog.py, produced by nothing (or not under the conditions "
        f"this test sets up): {sorted(wanted - set(found))}"
    )
    assert not labels_wrong(found)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_telemetry_writes_its_gpu_only_gauges(tmp_path):
    """The real CUDA path of the stand-ins above: peak memory from torch.cuda, times from CUDA events."""
    run_telemetry_rank(tmp_path, tmp_path / "metrics", "cuda")
    values = {sample.name: sample.value for family in merged_metrics(tmp_path / "metrics") for sample in family.samples}
    assert values[catalog.TRAIN_MEMORY_ALLOCATED_PEAK.name] > 0
    assert values[catalog.TRAIN_MEMORY_RESERVED_PEAK.name] >= values[catalog.TRAIN_MEMORY_ALLOCATED_PEAK.name]
    assert values[catalog.TRAIN_MFU.name] > 0
    training = {sample for sample, metric in SAMPLES.items() if metric.source == catalog.TELEMETRY}
    assert set(values) == training
