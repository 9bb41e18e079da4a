"""Checkpoints and resume for real: bit-identical resume (and a rerun of a completed run that changes nothing),
SIGTERM, SIGKILL mid-save, rotation."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from tests.helpers.runs import (
    REFERENCE_DDP,
    REFERENCE_DDP_STEPS,
    SLOW_RANK,
    explain,
    file_tree,
    kill_tree,
    logged_steps,
    start,
    summary,
    train,
    wait_for,
    weights,
)
from trainstack.rundir import LEASE_DIR, step_dir_name
from trainstack.train.rank import checkpoint

pytestmark = pytest.mark.slow


def test_resume_mid_epoch_matches_an_uninterrupted_run_and_rerunning_the_completed_part_changes_no_byte(
    tmp_path, ddp_reference
):
    stopped = tmp_path / "stopped"
    # 37 samples / (2 ranks x 4) = 5 steps per epoch: step 7 is mid-epoch 1.
    done = train(stopped, *REFERENCE_DDP, "--max-steps", "7", "--report")
    assert done.returncode == 0, explain(done)
    before = file_tree(stopped)
    again = train(stopped, *REFERENCE_DDP, "--max-steps", "7", "--report")
    assert again.returncode == 0, explain(again)
    assert again.stderr.splitlines() == [
        f"trainstack train: {stopped} already holds a completed run (7 steps, run {summary(stopped)['run_id']}); "
        "nothing changed: raise --max-steps or --epochs to train further, or choose another --output-dir"
    ]
    assert file_tree(stopped) == before

    further = train(stopped, *REFERENCE_DDP, "--max-steps", str(REFERENCE_DDP_STEPS))
    assert further.returncode == 0, explain(further)
    finished = summary(stopped)
    assert finished["resumed_from"].endswith("step-00000007")
    assert [s["last_step"] for s in finished["segments"]] == [7, REFERENCE_DDP_STEPS]
    for rank in (0, 1):
        lines = [json.loads(line) for line in (stopped / f"telemetry/rank-{rank}.jsonl").read_text().splitlines()]
        assert sum("segment_started" in line for line in lines) == 2
        assert [line["step"] for line in lines if "step" in line] == list(range(1, REFERENCE_DDP_STEPS + 1))
    last = step_dir_name(REFERENCE_DDP_STEPS)
    expected, resumed = weights(ddp_reference / "checkpoints" / last), weights(stopped / "checkpoints" / last)
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


def test_sigterm_checkpoints_exits_75_and_the_same_command_resumes_to_a_completion_a_late_sigterm_keeps(tmp_path):
    run_dir = tmp_path / "run"
    command = ("--model", "tests.factories:pausing_gpt", "--max-steps", "30", "--checkpoint-every", "0")
    process = start(run_dir, *command, env=SLOW_RANK)  # slowed: room to land the signal mid-run
    wait_for(lambda: logged_steps(run_dir) >= 5, process)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 75, output[-4000:]
    # said at once: the ranks stop at a step's end, which may be minutes away on a slow device
    ack = "trainstack train: SIGTERM received: the ranks stop after their next log interval, save a checkpoint and exit"
    assert output.count(ack) == 1, output[-4000:]
    assert not (run_dir / LEASE_DIR).exists()  # released on SIGTERM
    stopped = summary(run_dir)
    assert stopped["exit_reason"] == "preempted" and 5 <= stopped["steps"] < 30
    assert checkpoint.verify(run_dir / "checkpoints" / step_dir_name(stopped["steps"]))
    # The resumed launch gets its own SIGTERM once its ranks have ended (a scheduler's notice landing as the job
    # finishes: Slurm's --signal=B:TERM@120 on a job that ends inside those 120 s): it completed, so nothing to
    # requeue, and its card and report are still written
    resumed = start(run_dir, *command, "--report")
    said = []
    for line in resumed.stdout:
        said.append(line)
        if line.startswith("trainstack train: completed after 30 steps"):  # the ranks have exited: the report next
            resumed.send_signal(signal.SIGTERM)
            break
    output = "".join(said) + resumed.communicate(timeout=120)[0]
    assert resumed.returncode == 0, output[-4000:]
    assert "SIGTERM after the ranks ended: finishing the report, then exiting" in output, output[-4000:]
    assert "before any rank started" not in output and f"report: {run_dir / 'report.html'}" in output
    finished = summary(run_dir)
    assert finished["exit_reason"] == "completed" and finished["steps"] == 30
    assert finished["resumed_from"].endswith(step_dir_name(stopped["steps"]))
    assert [s["exit_reason"] for s in finished["segments"]] == ["preempted", "completed"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigkill_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(tmp_path, strategy):
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    args = ("--checkpoint-every", "1", "--keep-checkpoints", "2", "--max-steps", "100000", "--strategy", strategy)
    for _ in range(5):  # the kill must land while a checkpoint is half-written; retry if the save won the race
        process = start(run_dir, *args)
        wait_for(lambda: len(checkpoint.complete_checkpoints(root)) >= 1 and any(root.glob(".tmp-step-*")), process)
        kill_tree(process)
        if any(root.glob(".tmp-step-*")):
            break
    else:
        pytest.fail("never caught a checkpoint mid-write in 5 tries")
    latest = checkpoint.complete_checkpoints(root)[-1]
    step = checkpoint.read_train_state(latest)["step"]
    result = train(run_dir, "--checkpoint-every", "0", "--max-steps", str(step + 3), "--strategy", strategy)
    assert result.returncode == 0, explain(result)
    finished = summary(run_dir)
    assert finished["resumed_from"] == str(latest) and finished["steps"] == step + 3
    assert not any(root.glob(".tmp-step-*"))


def test_rotation_keeps_the_newest_and_they_load(tmp_path, ddp_reference):
    kept = checkpoint.complete_checkpoints(ddp_reference / "checkpoints")  # saved every 5 steps, keeping 2
    assert [p.name for p in kept] == ["step-00000015", step_dir_name(REFERENCE_DDP_STEPS)]
    assert not (ddp_reference / "checkpoints" / "step-00000010").exists()
    for folder in kept:
        assert checkpoint.verify(folder)["step"] == int(folder.name.split("-")[1])
    again = train(
        tmp_path / "from-15", *REFERENCE_DDP, "--resume", str(kept[0]), "--max-steps", str(REFERENCE_DDP_STEPS)
    )
    assert again.returncode == 0, explain(again)
    assert summary(tmp_path / "from-15")["resumed_from"] == str(kept[0])
    last = step_dir_name(REFERENCE_DDP_STEPS)
    expected, resumed = weights(kept[-1]), weights(tmp_path / "from-15" / "checkpoints" / last)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
        ),
    ],
)
def test_tied_weights_are_saved_once_quietly_and_reload_exactly(tmp_path, caplog, device):
    """The GPT's head is its token embedding. The checkpoint stores it once with no "Removed shared tensor"
    warning, and loading restores every parameter bit for bit with the tie intact."""
    from accelerate import Accelerator

    from trainstack.train.rank.checkpointer import drop_tied_aliases
    from trainstack.train.rank.model import BUILTIN_MODELS, GPT

    def prepared(seed: int):
        torch.manual_seed(seed)
        accelerator = Accelerator(cpu=device == "cpu")
        accelerator.register_save_state_pre_hook(drop_tied_aliases)
        model = GPT(BUILTIN_MODELS["tiny-gpt"], vocab_size=64, max_len=16)
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)
        tokens = torch.randint(0, 64, (2, 16), device=accelerator.device)
        model(tokens, labels=tokens).loss.backward()
        optimizer.step()
        return accelerator, model, optimizer

    saver, saved, _ = prepared(seed=1)
    with caplog.at_level("WARNING"):
        saver.save_state(str(tmp_path))
    assert "shared tensor" not in caplog.text
    stored = weights(tmp_path)
    assert "token_embedding.weight" in stored and "head.weight" not in stored
    loader, loaded, _ = prepared(seed=2)
    assert not torch.equal(loaded.head.weight, saved.head.weight)
    loader.load_state(str(tmp_path))
    for (name, expected), (_, actual) in zip(saved.named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(expected, actual), name
    assert loaded.head.weight is loaded.token_embedding.weight
