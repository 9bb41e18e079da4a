"""The loop's order around a log interval (train/rank/trainer.py): an interval's totals are read back only once the next
step is queued, so on a GPU the host's logging never leaves the device without work; a checkpoint, an evaluation
or the end of the run reads at once, and a stop the ranks agreed on takes effect after that one queued step with
none of its tokens lost. One real CPU rank, in a process of its own (Accelerate's state is per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.runs import REPO, explain

pytestmark = pytest.mark.slow

LOOP_PROBE = r"""
import argparse, json, sys
import trainstack.train.rank.trainer as rank
from trainstack.train.rank.config import add_arguments, from_sources

stop_after_queued = int(sys.argv[1])
parser = argparse.ArgumentParser()
add_arguments(parser)
trainer = rank.Trainer(from_sources(parser.parse_args(sys.argv[2:]), on_cuda=False))
queued = {"steps": 0, "tokens": 0}
reads = []  # [the interval's step, optimizer steps queued when its totals were read]

def counting_step(accelerator, model, optimizer, batch, *args):
    queued["steps"] += 1
    queued["tokens"] += int(batch["attention_mask"].sum())
    if queued["steps"] == stop_after_queued:
        trainer.stop.requested = True  # what SIGTERM sets
    return real_step(accelerator, model, optimizer, batch, *args)

def watched_log(self, interval, bar):
    reads.append([interval.step, queued["steps"]])
    return real_log(self, interval, bar)

real_step, rank.train_step = rank.train_step, counting_step
real_log, rank.Trainer._log_interval = rank.Trainer._log_interval, watched_log
code = trainer.run()
print(json.dumps({"code": code, "reads": reads, "steps": trainer.progress.step, "tokens": trainer.progress.tokens,
                  "queued_tokens": queued["tokens"], "exit": json.loads((trainer.run_dir.summary).read_text())}))
"""


def probe_loop(tmp_path, stop_after_queued: int, *args: str) -> dict:
    command = [
        sys.executable,
        "-c",
        LOOP_PROBE,
        str(stop_after_queued),
        "--output-dir",
        str(tmp_path / "run"),
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--max-steps",
        "12",
        "--log-every",
        "5",
        *args,
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, explain(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_interval_totals_are_read_after_the_next_step_is_queued(tmp_path):
    probe = probe_loop(tmp_path, 0, "--checkpoint-every", "8")
    assert probe["code"] == 0 and probe["exit"]["exit_reason"] == "completed" and probe["steps"] == 12
    # Logged at steps 1, 5 and 10, each read one step later; the checkpoint at 8 needs steps 6-8 at once, and the
    # last step has no next one.
    assert probe["reads"] == [[1, 2], [5, 6], [8, 8], [10, 11], [12, 12]]
    assert probe["tokens"] == probe["queued_tokens"]  # every step's tokens counted once


@pytest.mark.timeout(300)
def test_a_stop_agreed_at_an_interval_ends_the_run_after_the_queued_step(tmp_path):
    probe = probe_loop(tmp_path, 3, "--checkpoint-every", "0")
    assert probe["exit"]["exit_reason"] == "preempted" and probe["steps"] == 6
    assert probe["reads"] == [[1, 2], [5, 6], [6, 6]]  # the flag rode on step 5's totals; step 6 is logged too
    assert probe["tokens"] == probe["queued_tokens"]
