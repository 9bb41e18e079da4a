"""Bad input: one clear line, a non-zero exit, no traceback, and no existing checkpoint touched."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.helpers.runs import run_trainstack
from trainstack.commands.cli import main
from trainstack.train.rank import checkpoint


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
