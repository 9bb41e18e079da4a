"""Where each rank's time goes, for real: one 2-rank CPU run with a slow checkpoint and a slow evaluation, killed
(SIGKILL, every process at once) after it trained past its first checkpoint, then resumed to its end. Its
summary.json and report must account for both launches' wall time, put the injected pauses in their parts, and
count the steps the resume trained again as lost progress. The arithmetic on its own:
tests/unit/trainstack/test_breakdown.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.runs import explain, kill_tree, logged_steps, run_trainstack, start, summary, train, wait_for
from trainstack.breakdown import LOST_PROGRESS, OTHER
from trainstack.rundir import RunDir, read_json_lines
from trainstack.train.rank import checkpoint

pytestmark = pytest.mark.slow

DELAY = 1.5  # seconds each checkpoint save and each evaluation takes longer (tests/factories: SlowPausesGPT)
SLOW = {"TRAINSTACK_TEST_SAVE_DELAY": str(DELAY), "TRAINSTACK_TEST_EVAL_DELAY": str(DELAY)}
ARGS = (
    "--model",
    "tests.factories:slow_pauses_gpt",
    "--max-steps",
    "30",
    "--checkpoint-every",
    "10",
    "--eval-every",
    "10",
    "--log-every",
    "2",
)
KILLED_PAST = 14  # the first launch is killed once it has logged this step: steps 11-14 (at least) are redone


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory, monkeypatch_module) -> Path:
    run_dir = tmp_path_factory.mktemp("breakdown") / "run"
    for name, value in SLOW.items():
        monkeypatch_module.setenv(name, value)
    process = start(run_dir, *ARGS)
    # every rank's record of the step, not rank 0's alone: each writes its own, moments apart
    wait_for(lambda: min(logged_steps(run_dir, rank) for rank in (0, 1)) >= KILLED_PAST, process)
    kill_tree(process)
    saved = [checkpoint.read_train_state(c)["step"] for c in checkpoint.complete_checkpoints(run_dir / "checkpoints")]
    assert saved == [10], f"killed too late: checkpoints {saved}"
    result = train(run_dir, *ARGS, "--report")
    assert result.returncode == 0, explain(result)
    return run_dir


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_each_ranks_parts_add_up_to_its_wall_time_in_each_launch(killed_then_resumed):
    times = summary(killed_then_resumed)["time_breakdown"]
    assert [rank["rank"] for rank in times["ranks"]] == [0, 1]
    for rank in times["ranks"]:
        assert [segment["ended"] for segment in rank["segments"]] == ["killed", "exited"]
        for segment in rank["segments"]:
            # `other` is what the parts, each measured on its own, leave of the launch-to-exit time
            assert abs(segment["seconds"][OTHER]) <= 0.02 * segment["wall_seconds"], (rank["rank"], segment)
            assert segment["seconds"]["startup"] > 0 and segment["seconds"]["compute"] > 0
        assert not rank["host_bound_measured"]  # CPU ranks: not measured
    assert times["goodput"] == pytest.approx(times["seconds"]["compute"] / times["wall_seconds"])


def test_a_slow_checkpoint_and_a_slow_evaluation_land_in_their_parts(killed_then_resumed):
    for rank in summary(killed_then_resumed)["time_breakdown"]["ranks"]:
        killed, resumed = (segment["seconds"] for segment in rank["segments"])
        # the first launch saved and evaluated at step 10; the second at step 20 and at its end
        assert killed["checkpoint_save"] >= DELAY and killed["evaluation"] >= DELAY
        assert resumed["checkpoint_save"] >= 2 * DELAY and resumed["evaluation"] >= 2 * DELAY
        assert resumed["checkpoint_load"] > 0
    # and in no step: the step after a pause is timed from the pause's end
    lines = read_json_lines(RunDir(killed_then_resumed).rank_records(0))
    after_pauses = [
        line["step_seconds"][0]
        for line in lines
        if "time" in line and {pause["part"] for pause in line["paused"]} & {"checkpoint_save", "evaluation"}
    ]
    assert len(after_pauses) == 2 and max(after_pauses) < DELAY  # after step 10 in each launch (20 in the second)


def test_the_steps_the_resume_trained_again_are_lost_progress(killed_then_resumed):
    finished = summary(killed_then_resumed)
    assert [s["first_step"] for s in finished["segments"]] == [0, 10]
    for rank in finished["time_breakdown"]["ranks"]:
        lines = read_json_lines(RunDir(killed_then_resumed).rank_records(rank["rank"]))
        second_marker = [i for i, line in enumerate(lines) if "segment_started" in line][1]
        redone = [line for line in lines[:second_marker] if line.get("step", 0) > 10]
        assert redone and redone[-1]["step"] >= KILLED_PAST
        killed = rank["segments"][0]["seconds"]
        # the killed launch's steps after step 10; its checkpoint and evaluation at step 10 were not redone
        assert killed[LOST_PROGRESS] == pytest.approx(sum(sum(line["step_seconds"]) for line in redone), rel=1e-6)
        assert rank["segments"][1]["seconds"][LOST_PROGRESS] == 0


def test_the_report_draws_each_rank_and_each_launch(killed_then_resumed):
    page = RunDir(killed_then_resumed).report.read_text()
    assert "id='time-breakdown'" in page and "Goodput" in page


def test_every_evaluation_is_kept_through_the_resume_and_the_last_is_the_runs_eval_loss(killed_then_resumed):
    # step 10's, by the killed launch, came back with its checkpoint; the resumed launch's at 20 and at its end
    finished = summary(killed_then_resumed)
    evaluations = finished["evaluations"]
    assert [e["step"] for e in evaluations] == [10, 20, 30] and all(e["loss"] > 0 for e in evaluations)
    assert evaluations[-1]["loss"] == finished["eval_loss"]
    assert "<h2>Evaluations</h2>" in RunDir(killed_then_resumed).report.read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_rank_measures_its_host_bound_idle(tmp_path):
    result = run_trainstack(
        "train",
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "200",
        "--log-every",
        "20",
        "--exporter-port",
        "0",
        "--no-report",
    )
    assert result.returncode == 0, explain(result)
    for rank in summary(tmp_path / "run")["time_breakdown"]["ranks"]:
        assert rank["host_bound_measured"]
        (segment,) = rank["segments"]
        assert abs(segment["seconds"][OTHER]) <= 0.02 * segment["wall_seconds"], segment
