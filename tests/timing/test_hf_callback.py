"""transformers' Trainer with trainstack's callback under `trainstack watch -- torchrun` on 2 CPU ranks (gloo):
both ranks show on watch's exporter as DDP ranks, and diagnose calls the run healthy, then input-bound once the
collator is slowed on purpose (the callback in one process: tests/unit/trainstack/test_hf_callback.py; the verdicts of a
Trainer with no trainstack line, whose callback watch adds, in tests/timing/test_watched_matrix.py)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.runs import REPO, judged_while_unhealthy, run_trainstack, stop_process, torchrun, trainstack_command
from tests.helpers.scrapes import per_rank, scrape
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
        self.wait_until(lambda served: on_both(served, "trainstack_train_steps_total", lambda value: value >= steps))

    def wait_until(self, shown: Callable[[dict], bool], seconds: float = 300) -> dict:
        """The first scrape (its series by rank) where `shown` holds; fails at once if the run ends, and after
        `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            with contextlib.suppress(OSError):
                served = per_rank(scrape(self.url) or [])
                if shown(served):
                    return served
            assert self.process.poll() is None, f"the run ended early:\n{self.log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"not shown in {seconds:g} s:\n{self.log.read_text()[-4000:]}"
            time.sleep(0.5)


def on_both(served: dict, name: str, holds: Callable[[float], bool]) -> bool:
    """Whether series `name` shows on both ranks and its value `holds` on each."""
    values = served.get(name, {})
    return len(values) == 2 and all(holds(value) for value in values.values())


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
        # The record's series are written at least once a second of steps (docs/metrics.md): each rank's forward
        # time shows a few seconds after its steps at most
        forwarded = "trainstack_train_forward_seconds_total"
        served = run.wait_until(lambda series: on_both(series, forwarded, lambda value: value > 0), seconds=30)
        info = run_info(run.url)
        # Judged again over the next windows where one gives a verdict: the 2 shared cores can take CPU from one rank
        # for seconds (a CI run once found a straggler in the first window); a verdict the code gives, every window
        # gives.
        healthy = judged_while_unhealthy(lambda: verdicts(run.url), lambda found: found == [])
        slow_down.touch()
        run.wait_for(max(steps_by_rank(run.url).values()) + 2)  # each rank is past the step it was making
        slowed = verdicts(run.url)
    assert sorted((labels["rank"], labels["world_size"]) for labels in info) == [("0", "2"), ("1", "2")]
    # The gradient all-reduce is timed on both: the Trainer wrapped the model in DDP.
    assert set(served["trainstack_train_comm_seconds_total"]) == {"0", "1"}
    assert healthy[-1] == [], f"every window gave a verdict: {healthy}"
    assert slowed == ["input-bound"]
