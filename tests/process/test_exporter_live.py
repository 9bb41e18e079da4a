"""The exporter over a real training run: `trainstack train` on 2 CPU ranks, scraped over HTTP while it runs.

One run is shared by the tests of this module, in order: scrape it live, then hang and kill rank 1, then train
again in the same output directory. Besides the exporter the launcher starts, a second exporter is started
directly on the run's metrics directory: it is not stopped when the ranks end, so it shows what a crashed rank
leaves behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.runs import FAST, REPO, explain, run_trainstack, stop_process, trainstack_command
from tests.helpers.scrapes import by_labels, scrape
from trainstack.metric_files import merged_metrics
from trainstack.rundir import free_port

pytestmark = pytest.mark.slow
DEADLINE_SECONDS = 240  # generous: a loaded 2-core machine starts 2 ranks slowly; nothing here asserts speed


def wait_for(check: Callable[[], object], what: str, seconds: float = DEADLINE_SECONDS):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def by_rank(samples, name: str) -> dict[str, float]:
    return {dict(labels)["rank"]: value for (n, labels), value in samples.items() if n == name}


def rank_pids(metrics_dir: Path) -> dict[str, int]:
    """rank -> pid of its process: each pid's gauge files (`gauge_<mode>_<pid>.db`), read alone through
    prometheus_client's own merge, carry its rank."""
    ranks = {}
    for pid in {path.stem.rpartition("_")[2] for path in metrics_dir.glob("gauge_*.db")}:
        with tempfile.TemporaryDirectory() as alone:
            for path in metrics_dir.glob(f"gauge_*_{pid}.db"):
                shutil.copy(path, alone)
            for family in merged_metrics(alone):
                ranks.update((sample.labels["rank"], int(pid)) for sample in family.samples if "rank" in sample.labels)
    return ranks


class LiveRun:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.metrics_dir = run_dir / "metrics" / "node-0"
        self.port = free_port()
        self.standalone_port = free_port()
        self.launcher = subprocess.Popen(
            trainstack_command(
                "train", "--output-dir", str(run_dir), *FAST, "--max-steps", "100000", "--exporter-port", str(self.port)
            ),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for(self.metrics_dir.is_dir, "the launcher to make the metrics directory")
        self.standalone = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainstack.monitoring.exporter",
                "--port",
                str(self.standalone_port),
                "--metrics-dir",
                str(self.metrics_dir),
            ],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        for process in (self.launcher, self.standalone):
            stop_process(process)

    def output(self) -> str:
        self.stop()
        return self.launcher.stdout.read()[-8000:]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    run = LiveRun(tmp_path_factory.mktemp("live") / "run")
    try:
        yield run
    finally:
        run.stop()
        run.launcher.stdout.close()


def test_a_live_run_is_scraped_over_http_with_both_ranks_rising(live):
    def both_ranks_stepping():
        samples = by_labels(scrape(live.port))
        steps = by_rank(samples, "trainstack_train_steps_total") if samples else {}
        return samples if set(steps) == {"0", "1"} and min(steps.values()) >= 2 else None

    if live.launcher.poll() is not None:
        pytest.fail(f"the run ended early:\n{live.output()}")
    first = wait_for(both_ranks_stepping, "both ranks to report steps")
    first_steps = by_rank(first, "trainstack_train_steps_total")
    first_samples = by_rank(first, "trainstack_train_samples_total")
    # Steps and samples are held in the rank and written at least once a second (docs/metrics.md).
    second = wait_for(
        lambda: (
            (s := by_labels(scrape(live.port)))
            and all(by_rank(s, "trainstack_train_steps_total")[r] > first_steps[r] for r in ("0", "1"))
            and all(by_rank(s, "trainstack_train_samples_total").get(r, 0) > first_samples.get(r, 0) for r in "01")
            and s
        ),
        "the step and sample counters to rise",
    )
    for name in (
        "trainstack_train_samples_total",
        "trainstack_train_tokens_total",
        "trainstack_train_step_duration_seconds_count",
        "trainstack_train_last_step_timestamp_seconds",
    ):
        assert set(by_rank(second, name)) == {"0", "1"}, name
    info = {dict(labels)["rank"]: dict(labels) for (n, labels) in second if n == "trainstack_train_rank_info"}
    assert set(info) == {"0", "1"} and {i["local_rank"] for i in info.values()} == {"0", "1"}

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install Debian's prometheus package (make system-deps)")
    text = urllib.request.urlopen(f"http://127.0.0.1:{live.port}/metrics", timeout=10).read().decode()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def both_rank_pids(live: LiveRun) -> dict[str, int]:
    return wait_for(lambda: (p := rank_pids(live.metrics_dir)) and set(p) == {"0", "1"} and p, "rank pids")


def test_a_hung_then_killed_rank_stops_while_the_endpoint_answers(live):
    pids = both_rank_pids(live)
    os.kill(pids["1"], signal.SIGSTOP)  # rank 1 hangs; rank 0 then waits for it in the next collective
    last_step = "trainstack_train_last_step_timestamp_seconds"
    first_hung = wait_for(lambda: by_labels(scrape(live.port)), "a scrape after rank 1 hung")
    stopped_at = by_rank(first_hung, last_step)["1"]
    time.sleep(2)
    hung = by_labels(scrape(live.port))
    assert hung is not None, "the launcher's exporter stopped answering while a rank hung"
    assert by_rank(hung, last_step)["1"] == stopped_at

    os.kill(pids["1"], signal.SIGKILL)
    code = live.launcher.wait(timeout=DEADLINE_SECONDS)  # the other rank is torn down; the run fails
    assert code != 0, live.output()
    after = wait_for(lambda: by_labels(scrape(live.standalone_port)), "the standalone exporter to answer")
    assert by_rank(after, last_step)["1"] == stopped_at
    assert set(by_rank(after, "trainstack_train_steps_total")) == {"0", "1"}  # the dead rank's last values stay


def test_a_second_run_in_the_same_directory_shows_no_series_of_the_first(live):
    if live.launcher.poll() is None:  # run alone: end the first run as the test before this one does, no checkpoint
        os.kill(both_rank_pids(live)["1"], signal.SIGKILL)
        live.launcher.wait(timeout=DEADLINE_SECONDS)
    first_run_ids = {
        dict(labels)["run_id"]
        for (n, labels) in by_labels(scrape(live.standalone_port))
        if n == "trainstack_train_run_info"
    }
    assert first_run_ids  # the first run's series, still served: they must be gone below
    result = run_trainstack(
        "train",
        "--output-dir",
        str(live.run_dir),
        *FAST,
        "--max-steps",
        "5",
        "--resume",
        "never",
        timeout=DEADLINE_SECONDS,
    )
    assert result.returncode == 0, explain(result)
    new_run_id = json.loads((live.run_dir / "summary.json").read_text())["run_id"]
    samples = by_labels(scrape(live.standalone_port))  # the same exporter process, still reading the same path
    run_ids = {dict(labels)["run_id"] for (n, labels) in samples if n == "trainstack_train_run_info"}
    assert run_ids == {new_run_id} and not run_ids & first_run_ids
    assert by_rank(samples, "trainstack_train_steps_total") == {"0": 5, "1": 5}
