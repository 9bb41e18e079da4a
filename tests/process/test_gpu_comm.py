"""Gradient communication and the time breakdown on CUDA (issue 23): skipped without a GPU; on a GPU machine run
with `-m gpu`. A one-GPU DDP job (examples/ddp_loop.py under `trainstack watch -- torchrun`) still all-reduces its
gradients through NCCL, so its communication is timed on the GPU's clock; two GPUs, where at hand, with each
all-reduce held back as a slow link would, are comm-bound."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.runs import REPO, explain, run_trainstack, run_watched, summary, torchrun
from trainstack.breakdown import OTHER
from trainstack.rundir import RunDir, read_json_lines
from trainstack.telemetry.comm import TEST_ALLREDUCE_DELAY_ENV

# Skipped without a GPU, but where one is at hand each test starts `trainstack`: slow, like every test that starts
# a process (the guard in tests/conftest.py sees only tests that run, so it cannot catch this one on a CPU host).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def interval_records(run_dir, rank: int) -> list[dict]:
    return [line for line in read_json_lines(RunDir(run_dir).rank_records(rank)) if "step" in line]


def test_one_gpu_ddp_loop_times_its_all_reduce_on_the_gpu_clock(tmp_path):
    run_dir = tmp_path / "run"
    result = run_watched(
        run_dir,
        *torchrun(str(REPO / "examples" / "ddp_loop.py"), "--steps", "300", ranks=1),
        timeout=300,
    )
    assert result.returncode == 0, explain(result)
    records = interval_records(run_dir, 0)[1:]  # past the first step's warm-up
    assert records and all(line["clock"] == "gpu" for line in records)
    for line in records:
        assert 0 < line["comm_seconds"] and 0 <= line["comm_exposed_seconds"] <= line["comm_seconds"]
        assert line["comm_exposed_seconds"] <= sum(line["step_seconds"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_with_a_slow_link_are_comm_bound_and_their_time_adds_up(tmp_path):
    run_dir = tmp_path / "run"
    result = run_trainstack(
        "train",
        "--output-dir",
        str(run_dir),
        "--nproc-per-node",
        "2",
        "--max-steps",
        "60",
        "--log-every",
        "10",
        "--exporter-port",
        "0",
        "--no-report",
        env={TEST_ALLREDUCE_DELAY_ENV: "0.05"},
        timeout=600,
    )
    assert result.returncode == 0, explain(result)
    for rank in (0, 1):
        records = interval_records(run_dir, rank)[1:]
        exposed = sum(line["comm_exposed_seconds"] for line in records)
        assert exposed / sum(sum(line["step_seconds"]) for line in records) > 0.25  # the comm-bound threshold
    for rank in summary(run_dir)["time_breakdown"]["ranks"]:
        (segment,) = rank["segments"]
        assert abs(segment["seconds"][OTHER]) <= 0.02 * segment["wall_seconds"], segment
