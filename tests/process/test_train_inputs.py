"""Bad input: one clear line, a non-zero exit, no traceback, and no existing checkpoint touched."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.helpers.runs import run_trainstack
from trainstack.cli import main
from trainstack.errors import ConfigError
from trainstack.train.rank import checkpoint
from trainstack.train.rank.config import TrainConfig, read_config_file


def _fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def damaged_runs(tmp_path, cpu_run):
    """Copies of a real run whose only checkpoint is truncated, or has a byte changed."""
    runs = {}
    for kind in ("truncated", "tampered"):
        run_dir = tmp_path / kind
        shutil.copytree(cpu_run / "checkpoints", run_dir / "checkpoints")
        target = (
            run_dir
            / "checkpoints"
            / "step-00000040"
            / ("model.safetensors" if kind == "truncated" else "optimizer.bin")
        )
        data = bytearray(target.read_bytes())
        if kind == "truncated":
            del data[len(data) // 2 :]
        else:
            data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        runs[kind] = run_dir
    # An intact checkpoint that says FSDP wrote it, resealed so that it verifies.
    written_by_fsdp = tmp_path / "fsdp-written" / "checkpoints" / "step-00000040"
    shutil.copytree(cpu_run / "checkpoints" / "step-00000040", written_by_fsdp)
    (written_by_fsdp / checkpoint.MANIFEST).unlink()
    checkpoint.seal(written_by_fsdp, {**checkpoint.read_train_state(written_by_fsdp), "strategy": "fsdp"})
    runs["fsdp-written"] = written_by_fsdp.parent.parent
    return runs


def _cases(tmp_path: Path, damaged: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    (tmp_path / "empty").mkdir()
    typo = tmp_path / "typo.toml"
    typo.write_text("batchsize = 4\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("max_steps: [1,\n")
    wrong_type = tmp_path / "wrong-type.toml"
    wrong_type.write_text('batch_size = "16"\n')
    run = str(tmp_path / "run")
    return {
        "missing dataset path": (["--output-dir", run, "--dataset", str(tmp_path / "nope.jsonl")], "does not exist"),
        "unknown built-in model": (["--output-dir", run, "--model", "builtin:giant"], "unknown built-in model"),
        "model not module:function": (["--output-dir", run, "--model", "gpt"], "neither builtin:NAME"),
        "factory module missing": (["--output-dir", run, "--model", "no_such_pkg.models:build"], "cannot import"),
        "factory function missing": (["--output-dir", run, "--model", "tests.factories:nothing"], "has no function"),
        "zero batch size": (["--output-dir", run, "--batch-size", "0"], "--batch-size must be at least 1"),
        "negative batch size": (["--output-dir", run, "--batch-size", "-4"], "--batch-size must be at least 1"),
        "output dir is a file": (["--output-dir", str(a_file)], "is a file"),
        "resume path without checkpoint": (
            ["--output-dir", run, "--resume", str(tmp_path / "empty")],
            "not a complete trainstack checkpoint",
        ),
        "truncated checkpoint": (
            [
                "--output-dir",
                str(damaged["truncated"]),
                "--resume",
                str(damaged["truncated"] / "checkpoints/step-00000040"),
            ],
            "truncated",
        ),
        "tampered checkpoint": (
            [
                "--output-dir",
                str(damaged["tampered"]),
                "--resume",
                str(damaged["tampered"] / "checkpoints/step-00000040"),
            ],
            "SHA-256",
        ),
        "only damaged checkpoints, auto": (["--output-dir", str(damaged["tampered"])], "none of the 1 checkpoints"),
        "unknown config key": (["--output-dir", run, "--config", str(typo)], "did you mean 'batch_size'"),
        "config of the wrong type": (["--output-dir", run, "--config", str(wrong_type)], "batch_size must be int"),
        "unparseable config": (["--output-dir", run, "--config", str(broken)], "is not valid YAML"),
        "fp16 on CPU": (["--output-dir", run, "--mixed-precision", "fp16"], "fp16 needs CUDA"),
        "SyncBatchNorm on CPU": (["--output-dir", run, "--sync-batchnorm"], "SyncBatchNorm has no CPU kernel"),
        "bf16 gradient compression on CPU": (
            ["--output-dir", run, "--ddp-comm-hook", "bf16"],
            "--ddp-comm-hook bf16 needs CUDA GPUs",
        ),
        "no stopping condition": (["--output-dir", run, "--max-steps", "0"], "set --max-steps or --epochs"),
        "FSDP with SyncBatchNorm": (
            ["--output-dir", run, "--strategy", "fsdp", "--sync-batchnorm"],
            "--sync-batchnorm works with --strategy ddp only",
        ),
        "FSDP with find_unused_parameters": (
            ["--output-dir", run, "--strategy", "fsdp", "--find-unused-parameters"],
            "--find-unused-parameters is a DDP option",
        ),
        "unknown class to shard": (
            ["--output-dir", run, "--strategy", "fsdp", "--fsdp-wrap", "Block,Blok"],
            "--fsdp-wrap Blok: no such module class in builtin:tiny-gpt",
        ),
        "class to shard without FSDP": (["--output-dir", run, "--fsdp-wrap", "Block"], "needs --strategy fsdp"),
        "compile with FSDP": (
            ["--output-dir", run, "--strategy", "fsdp", "--compile"],
            "--compile with --strategy fsdp is not supported yet",
        ),
        "unknown strategy": (["--output-dir", run, "--strategy", "zero3"], "--strategy must be one of ddp, fsdp"),
        "FSDP checkpoint resumed as DDP": (
            ["--output-dir", str(damaged["fsdp-written"])],
            "was written with --strategy fsdp; resume it with --strategy fsdp",
        ),
        "bad node rank": (["--output-dir", run, "--nnodes", "2", "--node-rank", "2"], "--node-rank must be in 0..1"),
    }


@pytest.mark.slow
def test_every_bad_input_is_one_line_exit_2_and_touches_nothing(tmp_path, damaged_runs, capsys):
    """In-process through the CLI's own entry point (one torch import for all cases); an escaping exception
    would fail the test just as a traceback would."""
    before = {kind: _fingerprint(path) for kind, path in damaged_runs.items()}
    failures = []
    for name, (args, expected) in _cases(tmp_path, damaged_runs).items():
        code = main(["train", "--exporter-port", "0", *args])
        lines = capsys.readouterr().err.strip().splitlines()
        if not (
            code == 2 and len(lines) == 1 and lines[0].startswith("trainstack train: error: ") and expected in lines[0]
        ):
            failures.append(f"{name}: exit {code}, stderr: {lines}")
    assert not failures, "\n".join(failures)
    assert {kind: _fingerprint(path) for kind, path in damaged_runs.items()} == before
    assert not (tmp_path / "run").exists(), "a refused run must not create its output directory"


@pytest.mark.slow
def test_a_bad_input_from_the_shell_has_no_traceback(tmp_path):
    result = run_trainstack("train", "--output-dir", str(tmp_path / "run"), "--batch-size", "0", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "trainstack train: error: --batch-size must be at least 1, got 0"


def test_config_file_and_flags_merge_with_flags_winning(tmp_path):
    import argparse

    from trainstack.train.rank.config import add_arguments, from_sources

    toml = tmp_path / "c.toml"
    toml.write_text('batch_size = 4\nlr = 0.01\nmodel = "builtin:small-gpt"\n')
    assert read_config_file(str(toml)) == {"batch_size": 4, "lr": 0.01, "model": "builtin:small-gpt"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = from_sources(parser.parse_args(["--config", str(toml), "--batch-size", "8"]), on_cuda=False)
    assert (config.batch_size, config.lr, config.model) == (8, 0.01, "builtin:small-gpt")
    # what neither sets keeps the default
    assert config.num_workers == TrainConfig().num_workers


@pytest.mark.parametrize(
    "values, message",
    [
        ({"grad_accum": 0}, "--gradient-accumulation-steps must be at least 1"),
        ({"lr": 0.0}, "--learning-rate must be positive"),
        ({"lr_schedule": "step"}, "--lr-schedule must be one of"),
        ({"mixed_precision": "fp8"}, "--mixed-precision must be one of"),
        ({"collective_timeout": -1.0}, "--collective-timeout must be positive"),
        ({"eval_fraction": 1.0}, "--eval-fraction must be in [0, 1)"),
        ({"sync_batchnorm": 1}, "sync_batchnorm must be bool"),
        ({"prefetch_factor": 0}, "--prefetch-factor must be at least 1"),
        ({"num_workers": 0, "prefetch_factor": 4}, "--prefetch-factor 4 needs --num-workers 1 or more"),
        ({"ddp_bucket_cap_mb": 0}, "--ddp-bucket-cap-mb must be at least 1"),
        ({"ddp_comm_hook": "powersgd"}, "--ddp-comm-hook must be one of none, fp16, bf16"),
        ({"strategy": "fsdp", "ddp_bucket_cap_mb": 100}, "--ddp-bucket-cap-mb is a DDP option"),
        ({"strategy": "fsdp", "ddp_comm_hook": "bf16"}, "--ddp-comm-hook is a DDP option"),
        ({"ddp_static_graph": True, "grad_accum": 2}, "--ddp-static-graph needs --gradient-accumulation-steps 1"),
        ({"keep_checkpoints": -1}, "--keep-checkpoints must be 0 or more"),
        ({"keep_checkpoints": 0}, "--checkpoint-every 100 saves checkpoints that --keep-checkpoints 0 keeps none of"),
    ],
)
def test_config_validation_messages(values, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**values)


def test_training_doc_lists_every_option():
    import dataclasses

    from tests.helpers.runs import REPO
    from trainstack.train.rank.config import _flag

    doc = (REPO / "docs" / "training.md").read_text()
    missing = [f.name for f in dataclasses.fields(TrainConfig) if f"`{_flag(f.name)}" not in doc]
    assert not missing, f"docs/training.md does not describe {missing}"
