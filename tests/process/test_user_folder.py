"""trainstack runs inside a user's project folder: files there named like trainstack's parts (train.py,
monitoring.py, bench.py) never stand in for them, and the user's own factory module still imports from there."""

from __future__ import annotations

import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.runs import explain, summary, trainstack_command
from trainstack.rundir import free_port

# A user's model factory, as a user would write it: any nn.Module whose forward returns the loss.
USER_MODEL = """
import os
from pathlib import Path

import torch
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, input_ids, labels, **unused):
        logits = self.table(input_ids[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def build(config, vocab_size):
    Path(f"built-on-rank-{os.environ['RANK']}").touch()
    return Bigram(vocab_size)
"""


def steps_by_rank(port: int) -> dict[str, float]:
    """The exporter's trainstack_train_steps_total per rank; empty while nothing serves."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.labels["rank"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "trainstack_train_steps_total"
    }


@pytest.mark.slow
def test_files_named_like_trainstack_parts_never_replace_them(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("train", "monitoring", "supervisor", "commands", "bench"):
        (project / f"{name}.py").write_text(f'raise SystemExit("the user\'s {name}.py ran")\n')
    (project / "model.py").write_text(USER_MODEL)
    port = free_port()
    command = trainstack_command(
        "train",
        "--output-dir",
        "run",
        "--model",
        "model:build",
        "--max-steps",
        "400",
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--log-every",
        "5",
        "--no-report",
        "--exporter-port",
        str(port),
        "--master-port",
        str(free_port()),
    )
    process = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served, deadline = {}, time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        served = steps_by_rank(port)
        if sorted(served) == ["0", "1"] and min(served.values()) > 0:
            break
        time.sleep(0.5)
    stdout, stderr = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert result.returncode == 0, explain(result)
    assert "user's" not in stdout + stderr, explain(result)
    assert sorted(served) == ["0", "1"] and min(served.values()) > 0, f"never served both ranks' steps: {served}"
    assert sorted(p.name for p in project.glob("built-on-rank-*")) == ["built-on-rank-0", "built-on-rank-1"]
    assert summary(project / "run")["exit_reason"] == "completed"
