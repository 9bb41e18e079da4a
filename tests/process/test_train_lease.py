"""The run directory's lease and record with real 2-rank CPU runs: an intruder is refused and writes nothing, a
SIGKILLed run's lease is taken over and its record kept. (A completed run's rerun changes no byte:
test_train_checkpoint.py, on its resume test's run.)"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.runs import explain, file_tree, kill_tree, logged_steps, start, summary, train, wait_for
from trainstack.monitoring.report import render_report
from trainstack.monitoring.report.runfiles import load_run
from trainstack.rundir import LEASE_DIR
from trainstack.train.rank import checkpoint

pytestmark = pytest.mark.slow


def test_an_intruder_changes_nothing_and_a_sigkilled_run_is_taken_over_and_resumed(tmp_path, monkeypatch):
    # Rank 1 hangs in its 8th forward pass: the run is alive and holds its directory, but writes nothing more.
    for name, value in {
        "TRAINSTACK_TEST_SLOW_RANK": "1",
        "TRAINSTACK_TEST_SLOW_AFTER": "7",
        "TRAINSTACK_TEST_SLOW_SECONDS": "3600",
    }.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    args = ("--model", "tests.factories:pausing_gpt", "--checkpoint-every", "5")
    first = start(run_dir, *args, "--max-steps", "12")
    try:
        wait_for(lambda: logged_steps(run_dir) >= 5 and checkpoint.complete_checkpoints(run_dir / "checkpoints"), first)
        frozen, deadline = None, time.monotonic() + 60
        while frozen != (frozen := file_tree(run_dir)):  # settled: two looks a second apart agree
            assert time.monotonic() < deadline, "the paused run kept writing"
            time.sleep(1)
        holder = json.loads((run_dir / LEASE_DIR / "node-0.json").read_text())
        intruder = train(run_dir, *args, "--max-steps", "12", env={"TRAINSTACK_TEST_SLOW_RANK": "-1"})
        assert intruder.returncode == 2, explain(intruder)
        assert len(intruder.stderr.splitlines()) == 1, explain(intruder)
        assert f"PID {holder['pid']} (run {holder['run_id']}, node 0)" in intruder.stderr
        assert "--wait-for-lease" in intruder.stderr
        assert file_tree(run_dir) == frozen
    finally:
        kill_tree(first)  # the whole tree at once: the lease file stays behind, held by nobody

    monkeypatch.setenv("TRAINSTACK_TEST_SLOW_RANK", "-1")
    taker = train(run_dir, *args, "--max-steps", "12")
    assert taker.returncode == 0, explain(taker)
    assert f"took over the lease of {run_dir} from host" in taker.stderr
    assert f"PID {holder['pid']} is gone" in taker.stderr
    assert "Removed shared tensor" not in taker.stdout + taker.stderr  # tied weights are saved quietly
    assert not (run_dir / LEASE_DIR).exists()  # released on completion

    finished = summary(run_dir)
    assert finished["resumed_from"].endswith("step-00000005") and finished["steps"] == 12
    killed, resumed = finished["segments"]
    assert (killed["run_id"], killed["first_step"], killed["last_step"]) == (holder["run_id"], 0, 5)
    assert killed["exit_reason"] == "interrupted" and resumed["exit_reason"] == "completed"
    assert (resumed["first_step"], resumed["last_step"]) == (5, 12)
    assert finished["samples_per_second"] == pytest.approx(
        (killed["samples"] + resumed["samples"]) / (killed["train_seconds"] + resumed["train_seconds"])
    )
    # The killed launch's records are kept: the report reads both segments.
    run = load_run(run_dir)
    for launches in run.launches.values():
        first_segment, second_segment = (launch.records for launch in launches)
        assert [r.step for r in first_segment][:2] == [1, 5] and second_segment[-1].step == 12
    assert "<h2>Segments</h2>" in render_report(run_dir).read_text()
