"""On a CUDA GPU (issue 43): `trainstack watch` judges a GPU job with no line of it changed. A plain DDP loop of a
transformer language model in bf16 on one NCCL rank (bench/plain_gpu_loop.py) is recorded and judged: no input-bound
verdict while its loader keeps up, input-bound when each batch waits longer than a step takes. A Lightning
`Trainer(strategy="ddp")` on the GPU, launched by Lightning itself, gets trainstack's callback by itself. Run with
`pytest -m gpu -s`, which prints watch's lines and the end-of-run card of each (docs/benchmarks.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import REPO, explain, run_trainstack, torchrun
from trainstack.problems import INPUT_BOUND
from trainstack.record import read_launches
from trainstack.rundir import RunDir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LOOP = str(REPO / "bench" / "plain_gpu_loop.py")
LIGHTNING = str(REPO / "tests" / "drivers" / "lightning_plain.py")


def watched(run_dir: Path, *command: str) -> dict:
    """`command` under `trainstack watch` with the instrumentation on (the default): its summary.json."""
    done = run_trainstack("watch", "--run-dir", str(run_dir), "--exporter-port", "0", "--no-report", "--", *command)
    assert done.returncode == 0, explain(done)
    card = [line for line in done.stderr.splitlines() if line.startswith(("trainstack watch: ", "  "))]
    print(f"\n$ trainstack watch -- {' '.join(Path(part).name for part in command)}", *card, sep="\n")
    return json.loads(RunDir(run_dir).summary.read_text())


def kinds(summary: dict) -> list[str]:
    return [verdict["kind"] for verdict in summary["verdicts"]]


def test_a_plain_gpu_loop_is_judged_with_no_line_changed(tmp_path):
    healthy = watched(tmp_path / "healthy", *torchrun(LOOP, "healthy", "300", ranks=1))
    assert healthy["judged"] is True and healthy["world_size"] == 1
    assert INPUT_BOUND not in kinds(healthy), healthy["verdicts"]
    (launch,) = read_launches(RunDir(tmp_path / "healthy").rank_records(0))
    assert launch.records[-1].step == 320  # the loop's 20 warm-up steps and its 300
    assert sum(record.samples for record in launch.records) == 320 * 16

    slowed = watched(tmp_path / "slow-loader", *torchrun(LOOP, "slow-loader", "60", ranks=1))
    assert slowed["judged"] is True
    assert kinds(slowed)[:1] == [INPUT_BOUND], slowed["verdicts"]


def test_a_lightning_trainer_on_a_gpu_gets_trainstack_s_callback(tmp_path):
    summary = watched(tmp_path / "run", sys.executable, LIGHTNING, "60", "lightning.pytorch", "gpu")
    assert summary["judged"] is True and summary["world_size"] == 1
    (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(0))
    assert launch.records[-1].step == 60
