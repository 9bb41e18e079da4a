"""--compile on real processes: inductor on this CPU, two DDP ranks compiling in place with recompiles bounded by
the buckets, and the CUDA defaults where a GPU is (the CPU stand-ins: tests/unit/train/test_train_compile.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from tests.helpers.compile import tiny_gpt
from tests.helpers.runs import REPO, accelerate_launch, explain, summary, train
from trainstack.train.rank.config import TrainConfig
from trainstack.train.rank.model import BUILTIN_MODELS, GPT
from trainstack.train.rank.performance import compile_in_place

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.slow
@pytest.mark.skipif(not any(map(shutil.which, ("g++", "clang++", "c++"))), reason="needs a C++ compiler for inductor")
def test_inductor_compiles_the_builtin_model_on_this_cpu(fresh_dynamo):
    config = TrainConfig(compile=True, seq_len=32)
    model, reference = tiny_gpt(32), tiny_gpt(32)
    compile_in_place(model, config)
    ids = torch.randint(0, 64, (2, 32))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.allclose(loss, reference(input_ids=ids, labels=ids).loss, atol=1e-5)
    assert model.head.weight.grad is not None


@pytest.mark.slow
def test_two_ddp_ranks_compile_the_module_in_place_with_recompiles_bounded_by_buckets(tmp_path):
    """aot_eager: dynamo and AOTAutograd as with inductor, without generating C++ (minutes on this CPU).
    ACCELERATE_DYNAMO_BACKEND is what `accelerate launch --dynamo_backend inductor` sets: it must not add a compile
    of the DDP wrapper on top."""
    command = accelerate_launch(
        "-m",
        "tests.drivers.compile_probe",
        "--probe-dir",
        str(tmp_path),
        "--output-dir",
        str(tmp_path / "run"),
        "--compile",
        "--compile-backend",
        "aot_eager",
        "--seq-len",
        "64",
        "--bucket-size",
        "8",
        "--batch-size",
        "2",
        "--max-steps",
        "12",
        "--num-workers",
        "0",
        "--checkpoint-every",
        "0",
        "--no-telemetry",
    )
    result = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "ACCELERATE_USE_CPU": "1", "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"},
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert result.returncode == 0, explain(result)
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    eager_keys = sorted(GPT(BUILTIN_MODELS["tiny-gpt"], 64, 64).state_dict())
    for facts in ranks:
        assert facts["num_processes"] == 2 and facts["wrapper"] == "DistributedDataParallel", facts
        assert not facts["wrapper_is_compiled"] and not facts["inner_is_optimized_module"], facts
        assert facts["inner_compiled_in_place"] and facts["state_dict_keys"] == eager_keys
        assert 1 <= facts["recompiles"] <= 7, facts  # 8 buckets: at most 7 shapes after the first
    done = summary(tmp_path / "run")
    assert done["recompiles"] == ranks[0]["recompiles"] and done["compile_seconds"] > 0


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_cuda_defaults_train_gpt2_small_in_bf16(tmp_path):
    result = train(tmp_path / "run", "--max-steps", "20", "--checkpoint-every", "0", "--nproc-per-node", "1")
    assert result.returncode == 0, explain(result)
    done = summary(tmp_path / "run")
    assert (done["model"], done["dataset"], done["mixed_precision"]) == (
        "builtin:gpt2-small",
        "builtin:full-sequences",
        "bf16" if torch.cuda.is_bf16_supported() else "no",
    )


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_compile_on_cuda_keeps_to_the_buckets(tmp_path):
    result = train(
        tmp_path / "run",
        "--compile",
        "--model",
        "builtin:tiny-gpt",
        "--dataset",
        "builtin:sequences",
        "--seq-len",
        "256",
        "--bucket-size",
        "128",
        "--max-steps",
        "30",
        "--checkpoint-every",
        "0",
        "--nproc-per-node",
        "1",
    )
    assert result.returncode == 0, explain(result)
    done = summary(tmp_path / "run")
    assert done["compile_seconds"] > 0 and 0 <= done["recompiles"] <= 1, done
    assert "recompiles exceed" not in result.stderr
