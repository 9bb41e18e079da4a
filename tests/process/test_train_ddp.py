"""2-rank DDP over gloo for real: world size, identical replicas, falling loss, sharding, uneven and varied data, and
the throughput options (bucket size, static graph, compression hook, loader prefetch) reaching DDP and the loader."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import pytest
import torch

from tests.helpers.runs import REPO, accelerate_launch, explain, summary, train

pytestmark = pytest.mark.slow


def test_default_run_uses_two_gloo_ranks_and_learns(cpu_run):
    result = summary(cpu_run)
    assert result["world_size"] == 2
    assert result["distributed_type"] == "MULTI_CPU"
    assert result["exit_reason"] == "completed" and result["steps"] == 40
    assert result["final_loss"] < 0.8 * result["initial_loss"], result
    assert result["eval_loss"] is not None and result["samples_per_second"] > 0
    for key in ("epochs", "tokens_per_second", "wall_seconds"):
        assert key in result
    lines = [json.loads(line) for line in (cpu_run / "telemetry" / "rank-1.jsonl").read_text().splitlines()]
    records = [line for line in lines if "time" in line]  # not the launch's first and last lines
    assert records[-1]["step"] == 40 and records[-1]["step_seconds"]
    assert (cpu_run / "checkpoints" / "step-00000040" / "trainstack.json").is_file()
    recorded = json.loads((cpu_run / "environment" / "node-0.json").read_text())  # as the ranks got it
    assert recorded["variables"]["OMP_NUM_THREADS"] and recorded["variables"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert recorded["versions"]["accelerate"] and recorded["versions"]["python"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Both ranks' parameters and sample order after 2 epochs over 37 samples (batch 4: an uneven tail)."""
    out = tmp_path_factory.mktemp("probe")
    command = accelerate_launch(
        "-m",
        "tests.drivers.ddp_probe",
        "--probe-dir",
        str(out),
        "--output-dir",
        str(out / "run"),
        "--dataset",
        "tests.factories:indexed_37",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--max-steps",
        "0",
        "--eval-fraction",
        "0",
        "--num-workers",
        "1",
        "--no-telemetry",
        # Each throughput option away from its default, to see it reach DDP and the loader.
        "--ddp-bucket-cap-mb",
        "2",
        "--ddp-static-graph",
        "--ddp-comm-hook",
        "fp16",
        "--prefetch-factor",
        "3",
        "--no-persistent-workers",
    )
    result = subprocess.run(
        command, cwd=REPO, env={**os.environ, "ACCELERATE_USE_CPU": "1"}, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, explain(result)
    return [torch.load(out / f"rank-{rank}.pt", weights_only=True) for rank in (0, 1)]


def test_probe_ran_two_cpu_processes(probe):
    for rank in probe:
        assert rank["num_processes"] == 2
        assert rank["distributed_type"].endswith("MULTI_CPU")
        assert rank["exit_code"] == 0


def test_replicas_hold_identical_parameters(probe):
    first, second = (rank["parameters"] for rank in probe)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_each_epoch_covers_every_sample_once_apart_from_evenness_padding(probe):
    for epoch in (0, 1):
        seen = probe[0]["orders"][epoch] + probe[1]["orders"][epoch]
        assert set(seen) == set(range(1, 38))
        # 37 samples over 2 ranks x 4 per batch: 5 batches per rank = 40 slots, 3 of them repeats.
        assert len(seen) == 40
        assert sum(count - 1 for count in Counter(seen).values()) == 3
        assert not set(probe[0]["orders"][epoch]) & set(probe[1]["orders"][epoch]) - {
            s for s, c in Counter(seen).items() if c > 1
        }


def test_the_throughput_options_reach_ddp_and_the_loader(probe):
    for rank in probe:
        assert rank["ddp"] == {
            "bucket_bytes_cap": 2 * 1024 * 1024,
            "static_graph": True,
            "comm_hooks": ["fp16_compress_hook"],  # DDP's own hook, registered by Accelerate
        }
        assert rank["loader"] == {
            "num_workers": 1,
            "prefetch_factor": 3,
            "persistent_workers": False,
            "pin_memory": False,  # a CPU rank: nothing to pin for
        }


def test_each_epoch_has_a_new_order(probe):
    for rank in probe:
        assert rank["orders"][0] != rank["orders"][1]


# Each file also carries a model one of the seeds' users met, which needs no run of its own: a head forward never
# calls (DDP reduces it only with --find-unused-parameters) and BatchNorm, which DDP broadcasts buffers for.
MODELS_BESIDE_THE_FILES = {
    ".jsonl": ["--model", "tests.factories:with_unused_parameter", "--find-unused-parameters"],
    ".txt": ["--model", "tests.factories:batchnorm_lm"],
}


@pytest.mark.parametrize(
    "suffix", [".jsonl", ".txt"], ids=["jsonl-and-an-unused-parameter-with-the-flag", "txt-and-batchnorm"]
)
def test_local_text_files_of_varied_length(tmp_path, suffix):
    lines = [f"sample {i}: " + "abc " * (i % 17) for i in range(61)]
    data = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        data.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    else:
        data.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    result = train(
        run_dir, "--dataset", str(data), "--max-steps", "6", "--batch-size", "5", *MODELS_BESIDE_THE_FILES[suffix]
    )
    assert result.returncode == 0, explain(result)
    done = summary(run_dir)
    assert done["steps"] == 6 and done["tokens_per_second"] > 0 and done["eval_loss"] is not None


def test_bf16_with_gradient_accumulation(tmp_path):
    # Short sequences: a CPU without bf16 matrix units emulates bf16, a quarter of the tokens a quarter of that cost.
    bf16 = ("--mixed-precision", "bf16", "--gradient-accumulation-steps", "2", "--max-steps", "3", "--seq-len", "32")
    result = train(tmp_path / "run", *bf16)
    assert result.returncode == 0, explain(result)
    done = summary(tmp_path / "run")
    assert done["mixed_precision"] == "bf16" and done["steps"] == 3
    lines = [json.loads(line) for line in (tmp_path / "run/telemetry/rank-0.jsonl").read_text().splitlines()]
    records = [line for line in lines if "time" in line]  # not the launch's segment marker (trainstack/telemetry/)
    # Two micro-batches of 8 per optimizer step: 16 samples per step, counted per rank in its own records.
    assert sum(r["samples"] for r in records) == 3 * 16
