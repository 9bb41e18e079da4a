"""bench scaling on processes: a real DDP run on 1 and 2 CPU ranks with a table, JSON and a plot, and the
DataParallel script's loop on the CPU (the figures from given measurements: tests/unit/train/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from tests.helpers.runs import REPO, explain
from trainstack.train.launcher.scaling.runs import DATAPARALLEL_SCRIPT

TINY = ["--max-steps", "3", "--batch-size", "4", "--num-workers", "0", "--seq-len", "32"]


@pytest.mark.slow
def test_cpu_host_runs_ddp_on_one_and_two_ranks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "trainstack", "bench", "scaling", "--output-dir", str(tmp_path), *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, explain(done)
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["mode", "CPU", "ranks", "samples/s", "speed-up", "efficiency", "exposed", "comm"]
    assert [line.split()[:2] for line in lines[1:3]] == [["DDP", "1"], ["DDP", "2"]]
    assert lines[3].startswith("nn.DataParallel comparison needs GPUs")
    results = json.loads((tmp_path / "scaling.json").read_text())
    assert results["gpus"] == 0 and [r["devices"] for r in results["results"]] == [1, 2]
    assert all(r["samples_per_second"] > 0 for r in results["results"])
    assert results["results"][0]["efficiency"] == 1.0
    # One rank communicates nothing; two wait for their all-reduce some share of the step, as their records say.
    one, two = results["results"]
    assert one["exposed_comm_share"] is None and lines[1].split()[-1] == "-"
    records = [json.loads(line) for line in (tmp_path / "ddp-2/telemetry/rank-0.jsonl").read_text().splitlines()]
    assert sum(r.get("comm_buckets", 0) for r in records) > 0
    assert 0 < two["exposed_comm_share"] < 1 and lines[2].split()[-1] == f"{100 * two['exposed_comm_share']:.0f}%"
    for devices in (1, 2):
        assert json.loads((tmp_path / f"ddp-{devices}" / "summary.json").read_text())["world_size"] == devices
    assert Image.open(tmp_path / "scaling.png").format == "PNG"


@pytest.mark.slow
def test_dataparallel_loop_runs_unsplit_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(DATAPARALLEL_SCRIPT), "--gpus", "0", *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, explain(done)
    assert json.loads(done.stdout.splitlines()[-1])["samples_per_second"] > 0
