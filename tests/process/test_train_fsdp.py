"""--strategy fsdp for real on two gloo CPU ranks: it learns like DDP, holds about half the state per rank,
resumes bit-exactly after SIGTERM, reshards its checkpoint to another world size, and exports loadable weights."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import (
    REFERENCE_FSDP,
    REFERENCE_FSDP_STEPS,
    SLOW_RANK,
    explain,
    logged_steps,
    start,
    summary,
    train,
    wait_for,
)
from trainstack.rundir import step_dir_name
from trainstack.train.launcher.export import read_dcp
from trainstack.train.rank import checkpoint
from trainstack.train.rank.model import BUILTIN_MODELS, GPT

pytestmark = pytest.mark.slow

FSDP = ["--strategy", "fsdp"]
INDEXED_37_VOCAB = 39  # tests.factories.IndexedSequences(37).vocab_size


def _records(run_dir: Path, rank: int) -> list[dict]:
    """The rank's telemetry records, without the launch's segment marker line (trainstack/telemetry/)."""
    lines = [json.loads(line) for line in (run_dir / "telemetry" / f"rank-{rank}.jsonl").read_text().splitlines()]
    return [line for line in lines if "time" in line]


def _export(folder: Path, output: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from tests.helpers.runs import run_trainstack

    result = run_trainstack("export", str(folder), "--output", str(output), timeout=120)
    assert result.returncode == 0, explain(result)
    return load_file(output)


@pytest.fixture(scope="module")
def side_by_side(ddp_reference, fsdp_reference) -> dict[str, Path]:
    """The session's reference runs: the same model, data and seed once per strategy, the loss logged at every step."""
    return {"ddp": ddp_reference, "fsdp": fsdp_reference}


def test_fsdp_learns_and_matches_ddp_on_the_first_steps(side_by_side):
    done = summary(side_by_side["fsdp"])
    assert done["distributed_type"] == "FSDP" and done["world_size"] == 2 and done["steps"] == REFERENCE_FSDP_STEPS
    ddp, fsdp = ([r["loss"] for r in _records(side_by_side[s], 0)][:6] for s in ("ddp", "fsdp"))
    assert len(fsdp) == 6 and fsdp[-1] < fsdp[0], fsdp
    # The same mathematics with another reduction (reduce-scatter instead of all-reduce): float rounding only.
    assert fsdp == pytest.approx(ddp, rel=1e-4), (ddp, fsdp)


def test_each_fsdp_rank_holds_about_half_of_ddps_state(side_by_side):
    for rank in (0, 1):
        ddp, fsdp = (_records(side_by_side[s], rank)[-1] for s in ("ddp", "fsdp"))
        for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
            assert 0 < fsdp[key] <= 0.6 * ddp[key], (rank, key, ddp[key], fsdp[key])


def test_fsdp_ranks_time_their_all_gathers_and_reduce_scatters(side_by_side):
    """Per step: an all-gather before the forward of each of the four units (two blocks, the final norm, the root
    with the tied embedding), the blocks' again before their backward (the others stay gathered), and one
    reduce-scatter per unit (trainstack/telemetry/fsdp_comm.py). gloo's collectives hold a CPU rank's host: all of each
    is exposed."""
    for rank in (0, 1):
        records = _records(side_by_side["fsdp"], rank)
        assert [r["comm_buckets"] for r in records] == [10] * REFERENCE_FSDP_STEPS
        for record in records:
            assert 0 < record["comm_exposed_seconds"] == pytest.approx(record["comm_seconds"])


def test_sharded_checkpoint_reshards_to_one_rank_and_exports_to_the_plain_model(side_by_side, tmp_path):
    last = step_dir_name(REFERENCE_FSDP_STEPS)
    saved = side_by_side["fsdp"] / "checkpoints" / last
    assert (saved / "pytorch_model_fsdp_0" / "__1_0.distcp").is_file() and not (saved / "model.safetensors").exists()
    # Resumed on one rank with nothing left to train: it saves its last step again, now as one rank's shards.
    one_rank = tmp_path / "one-rank"
    command = (
        *REFERENCE_FSDP,
        "--nproc-per-node",
        "1",
        "--resume",
        str(saved),
        "--max-steps",
        str(REFERENCE_FSDP_STEPS),
    )
    result = train(one_rank, *command)
    assert result.returncode == 0, explain(result)
    resaved = one_rank / "checkpoints" / last
    assert summary(one_rank)["world_size"] == 1 and summary(one_rank)["resumed_from"] == str(saved)
    # 12 steps of 5 per epoch: two batches per rank into epoch 2 on two ranks are four batches on one.
    assert checkpoint.read_train_state(resaved)["batch_in_epoch"] == 4
    assert sorted(p.name for p in (resaved / "pytorch_model_fsdp_0").glob("*.distcp")) == ["__0_0.distcp"]
    two, one = _export(saved, tmp_path / "two.safetensors"), _export(resaved, tmp_path / "one.safetensors")
    assert two.keys() == one.keys()
    for name in two:
        assert torch.equal(two[name], one[name]), name
    optimizer_two, optimizer_one = (
        read_dcp(folder / "optimizer_0")["optimizer"]["state"] for folder in (saved, resaved)
    )
    for name, state in optimizer_two.items():
        for key, value in state.items():
            assert torch.equal(value, optimizer_one[name][key]), (name, key)
    plain = GPT(BUILTIN_MODELS["tiny-gpt"], INDEXED_37_VOCAB, 128)
    plain.load_state_dict(two, strict=True)
    assert plain.head.weight is plain.token_embedding.weight
    assert torch.equal(plain.blocks[1].mlp[2].weight, two["blocks.1.mlp.2.weight"])


def test_sigterm_then_resume_equals_an_uninterrupted_fsdp_run(tmp_path, fsdp_reference):
    # The slow rank leaves time to land the signal mid-run.
    command = (*REFERENCE_FSDP, "--max-steps", str(REFERENCE_FSDP_STEPS))
    stopped = tmp_path / "stopped"
    process = start(stopped, *command, env=SLOW_RANK)
    wait_for(lambda: logged_steps(stopped) >= 3, process)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 75, output[-4000:]
    at = summary(stopped)["steps"]
    assert 3 <= at < REFERENCE_FSDP_STEPS and checkpoint.verify(stopped / "checkpoints" / step_dir_name(at))
    resumed = train(stopped, *command)
    assert resumed.returncode == 0, explain(resumed)
    assert summary(stopped)["resumed_from"].endswith(step_dir_name(at))
    last = step_dir_name(REFERENCE_FSDP_STEPS)
    expected = _export(fsdp_reference / "checkpoints" / last, tmp_path / "straight.safetensors")
    got = _export(stopped / "checkpoints" / last, tmp_path / "stopped.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_gpu_fsdp_run_in_bf16_learns_and_reports_its_memory(tmp_path):
    run_dir = tmp_path / "run"
    result = train(
        run_dir,
        *FSDP,
        "--model",
        "builtin:small-gpt",
        "--mixed-precision",
        "bf16",
        "--max-steps",
        "50",
        "--nproc-per-node",
        "1",
        "--batch-size",
        "16",
        "--num-workers",
        "2",
        "--log-every",
        "10",
    )
    assert result.returncode == 0, explain(result)
    done = summary(run_dir)
    assert done["distributed_type"] == "FSDP" and done["world_size"] == 1 and done["device"] == "cuda"
    assert done["final_loss"] < done["initial_loss"], done
    last = _records(run_dir, 0)[-1]
    # One rank holds everything: fp32 master weights and gradients, AdamW's two fp32 moments.
    assert last["grad_bytes"] == last["param_bytes"] and last["optimizer_state_bytes"] >= 2 * last["param_bytes"]
    print(json.dumps({key: last[key] for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes")}))
