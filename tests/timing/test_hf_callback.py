"""transformers' Trainer with trainstack's callback under `trainstack watch -- torchrun` on 2 CPU ranks (gloo):
both ranks show on watch's exporter as DDP ranks, and diagnose calls the run healthy, then input-bound once the
collator is slowed on purpose; and a run with rank 1 slowed after its optimizer step names rank 1 the straggler (the
callback in one process: tests/unit/trainstack/test_hf_callback.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.runs import REPO, run_trainstack, stop_process, torchrun, trainstack_command
from tests.helpers.scrapes import per_rank, scrape
from trainstack.monitoring.diagnose.finished import judged
from trainstack.rundir import free_port


# ---- 2 ranks under trainstack watch, read live ------------------------------------------------------------
def steps_by_rank(url: str) -> dict[str, float]:
    with contextlib.suppress(OSError):
        return per_rank(scrape(url) or []).get("trainstack_train_steps_total", {})
    return {}


@dataclass
class WatchedRun:
    url: str
    """The exporter's /metrics."""
    process: subprocess.Popen
    log: Path

    def wait_for(self, steps: float) -> None:
        """Until both ranks have made `steps` steps; fails at once if the run ends."""
        deadline = time.monotonic() + 300
        while len(done := steps_by_rank(self.url)) < 2 or min(done.values()) < steps:
            assert self.process.poll() is None, f"the run ended early:\n{self.log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"not {steps} steps in 300 s: {done}\n{self.log.read_text()[-4000:]}"
            time.sleep(0.5)


@contextlib.contextmanager
def watched_run(folder: Path, *command: str) -> Iterator[WatchedRun]:
    """`trainstack watch -- torchrun --nproc_per_node 2 COMMAND --output-dir ...`: 2 CPU ranks, with the exporter
    watch starts beside them, until the test is done with them."""
    port = free_port()
    log = folder / "watch.log"
    with log.open("w") as output:
        watch = subprocess.Popen(
            trainstack_command(
                "watch",
                "--run-dir",
                str(folder / "run"),
                "--exporter-port",
                str(port),
                "--no-report",
                "--",
                *torchrun(*command),
                "--output-dir",
                str(folder / "out"),
                "--max-steps",
                "100000",
            ),
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield WatchedRun(f"http://127.0.0.1:{port}/metrics", watch, log)
    finally:
        stop_process(watch)  # watch passes SIGTERM on to torchrun, torchrun to the ranks


def run_info(url: str) -> list[dict[str, str]]:
    """The labels of each rank's trainstack_train_run_info series."""
    with urllib.request.urlopen(url, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        return [
            sample.labels
            for family in families
            if family.name == "trainstack_train_run_info"
            for sample in family.samples
        ]


def verdicts(url: str) -> list[str]:
    """The kinds of what `trainstack diagnose` finds over 6 s of the run."""
    result = run_trainstack("diagnose", "--url", url, "--interval", "6", "--json")
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: a problem found
    return [verdict["kind"] for verdict in json.loads(result.stdout)["verdicts"]]


@pytest.mark.slow
@pytest.mark.timing  # healthy means ranks at one speed: another test's ranks on the same cores make a straggler
def test_ddp_ranks_show_on_the_exporter_healthy_then_input_bound_once_the_collator_slows_down(tmp_path):
    slow_down = tmp_path / "slow-down"
    # 32 samples a step: at the example's 8, this small model's ranks wait at the collectives (its gradient
    # all-reduce and the Trainer's label-count gather) a quarter of each step on a 2-core host, comm-bound by the
    # registry's 25%, no healthy run.
    with watched_run(
        tmp_path,
        "-m",
        "tests.drivers.hf_example",
        "--slow-down-when",
        str(slow_down),
        "--delay",
        "0.3",
        "--batch-size",
        "32",
    ) as run:
        run.wait_for(10)
        served, info = per_rank(scrape(run.url)), run_info(run.url)
        healthy = verdicts(run.url)
        slow_down.touch()
        run.wait_for(max(steps_by_rank(run.url).values()) + 2)  # each rank is past the step it was making
        slowed = verdicts(run.url)
    assert sorted((labels["rank"], labels["world_size"]) for labels in info) == [("0", "2"), ("1", "2")]
    # The gradient all-reduce is timed on both: the Trainer wrapped the model in DDP.
    assert set(served["trainstack_train_comm_seconds_total"]) == {"0", "1"}
    assert all(value > 0 for value in served["trainstack_train_forward_seconds_total"].values())
    assert healthy == []
    assert slowed == ["input-bound"]


@pytest.mark.slow
@pytest.mark.timing
def test_a_rank_slowed_after_its_optimizer_step_is_named_and_its_peer_is_not_input_bound(tmp_path):
    """Rank 0 waits for rank 1 at the Trainer's gather of the label counts, inside its fetch of the next batch
    (`average_tokens_across_devices`): a wait at the collectives, never data wait (issue 43: it read input-bound)."""
    extra = 0.05
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("TRAINSTACK_RUN_DIR", None)
    done = subprocess.run(
        trainstack_command("watch", "--run-dir", str(tmp_path / "run"), "--exporter-port", "0", "--no-report", "--")
        + torchrun(
            "-m",
            "tests.drivers.hf_example",
            "--slow-down-when",
            str(tmp_path / "never"),
            "--delay",
            "0",
            "--rank-1-after-step",
            str(extra),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "150",
        ),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    verdicts = judged(tmp_path / "run")
    assert verdicts is not None
    assert [verdict["kind"] for verdict in verdicts] == ["straggler"], verdicts
    assert verdicts[0]["summary"].startswith("rank 1 is a straggler:"), verdicts
