"""The distributed failures the seeds' users meet, turned into clear errors (or handled), for real on 2 ranks."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.runs import explain, summary, train, weights
from trainstack.rundir import LEASE_DIR

pytestmark = pytest.mark.slow


def test_unused_parameter_error_names_the_flag_and_exits_2(tmp_path):
    result = train(tmp_path / "run", "--model", "tests.factories:with_unused_parameter", "--max-steps", "4")
    assert result.returncode == 2, explain(result)
    assert "find_unused_parameters" in result.stderr and "--find-unused-parameters" in result.stderr
    assert summary(tmp_path / "run")["exit_reason"] == "failed"
    assert not (tmp_path / "run" / LEASE_DIR).exists()  # released on a failure


def test_a_run_that_diverges_stops_before_it_saves_and_says_how_to_resume(tmp_path):
    # Far too high a learning rate and no clipping: the loss is inf or nan within a few intervals
    result = train(
        tmp_path / "run",
        *("--learning-rate", "10000", "--max-grad-norm", "0", "--max-steps", "60", "--checkpoint-every", "5"),
        *("--log-every", "5"),
    )
    assert result.returncode == 2, explain(result)
    assert "training diverged, and nothing from it is saved" in result.stderr and "HEALTHY" not in result.stderr
    failed = summary(tmp_path / "run")
    assert failed["exit_reason"] == "failed", failed
    assert failed["final_loss"] is None or math.isfinite(failed["final_loss"]), failed  # the last finite loss
    kept = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert all(int(folder.name.split("-")[1]) < failed["steps"] for folder in kept), (kept, failed["steps"])
    # the update after the last finite loss is checked too: what is kept resumes
    assert all(torch.isfinite(tensor).all() for folder in kept for tensor in weights(folder).values()), kept
    assert "NaN" not in (tmp_path / "run" / "summary.json").read_text()  # JSON any reader takes


def test_an_output_ddps_static_graph_cannot_look_into_is_refused_after_the_first_step(tmp_path):
    # DDP then reduces no gradient and each rank trains on its own, silently: the ranks' weights tell
    result = train(
        tmp_path / "run", "--model", "tests.factories:unregistered_output_gpt", "--ddp-static-graph", "--max-steps", "4"
    )
    assert result.returncode == 2, explain(result)
    last = result.stderr.strip().splitlines()[-1]
    assert "the ranks' weights differ after the first step under --ddp-static-graph" in last, explain(result)
    assert "torch.export.register_dataclass" in last and "Traceback" not in result.stderr, explain(result)
    assert summary(tmp_path / "run")["steps"] == 1


def test_a_hung_rank_becomes_an_error_that_names_it(tmp_path):
    hang = {"TRAINSTACK_TEST_SLOW_RANK": "1", "TRAINSTACK_TEST_SLOW_AFTER": "7", "TRAINSTACK_TEST_SLOW_SECONDS": "3600"}
    result = train(
        tmp_path / "run",
        "--model",
        "tests.factories:pausing_gpt",
        "--max-steps",
        "50",
        "--collective-timeout",
        "5",
        env=hang,
        timeout=240,
    )
    assert result.returncode == 1, explain(result)
    failed = summary(tmp_path / "run")
    assert failed["exit_reason"] == "failed"
    assert "--collective-timeout 5 s" in failed["error"] and "rank 1 stopped first" in failed["error"], failed


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="SyncBatchNorm runs only on CUDA: needs 2 GPUs")
def test_sync_batchnorm_trains_on_two_gpus(tmp_path):
    result = train(
        tmp_path / "run",
        "--model",
        "tests.factories:batchnorm_lm",
        "--max-steps",
        "4",
        "--sync-batchnorm",
        "--nproc-per-node",
        "2",
    )
    assert result.returncode == 0, explain(result)
