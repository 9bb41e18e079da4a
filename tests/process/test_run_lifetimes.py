"""Faults that happen on real hosts, injected into a 2-rank CPU run: no process of a run outlives its launcher,
and a rerun resumes (docs/training.md, "When a run dies")."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers.runs import (
    FAST,
    REFERENCE_DDP,
    REFERENCE_DDP_STEPS,
    REPO,
    explain,
    logged_steps,
    summary,
    train,
    trainstack_command,
    wait_for,
    weights,
)
from trainstack.rundir import (
    FORK_RANKS_ENV,
    LEASE_DIR,
    METRICS_DIR_ENV,
    STOP_GRACE_ENV,
    free_port,
    hang_pid_file,
    step_dir_name,
)
from trainstack.supervisor.exporter_process import SupervisedExporter
from trainstack.train.rank import checkpoint

pytestmark = pytest.mark.slow

GRACE = 40.0  # TRAINSTACK_STOP_GRACE for these runs: what an orphan has to stop before it is killed
# Rank 0 pauses in each forward pass, so a kill lands mid-run; the pause changes no number.
ENV = {"TRAINSTACK_TEST_SLOW_RANK": "0", "TRAINSTACK_TEST_SLOW_SECONDS": "0.2", STOP_GRACE_ENV: f"{GRACE:g}"}
STEPS = REFERENCE_DDP_STEPS
# torch's own log lines (glog style: level, date, time): a stop that went as planned prints none of them
TORCH_LOG_LINE = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)
COMMAND = (*REFERENCE_DDP, "--max-steps", str(STEPS))  # stopped runs of the session's ddp_reference


@pytest.fixture(scope="module")
def uninterrupted(ddp_reference) -> dict[str, torch.Tensor]:
    return weights(ddp_reference / "checkpoints" / step_dir_name(STEPS))


def _start(run_dir: Path, *args: str, exporter_port: int = 0, env: dict | None = None) -> subprocess.Popen:
    """The launcher in a process group of its own, as a shell job or a container's PID 1 would be."""
    command = trainstack_command(
        "train", "--output-dir", str(run_dir), *FAST, *COMMAND, *args, "--exporter-port", str(exporter_port)
    )
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, **ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _of_the_run(process: psutil.Process, run_dir: Path) -> bool:
    """The launcher names the run directory on its command line; everything under it has the run's metrics
    folder in its environment (the agent, the ranks, their loader workers, the exporter)."""
    try:
        return str(run_dir) in " ".join(process.cmdline()) or process.environ().get(METRICS_DIR_ENV, "").startswith(
            str(run_dir.resolve())
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _left_running(run_dir: Path) -> list[str]:
    left = [p for p in psutil.process_iter() if _of_the_run(p, run_dir)]
    return [
        f"{p.pid} {' '.join(p.cmdline())[:160]}" for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def _wait_until_none_left(run_dir: Path) -> None:
    """Everything of the run ends within the grace period (with room for a loaded CI machine to notice)."""
    deadline = time.monotonic() + GRACE + 15
    while left := _left_running(run_dir):
        assert time.monotonic() < deadline, f"still running after the grace period: {left}"
        time.sleep(0.5)


def _child(process: subprocess.Popen, module: str) -> psutil.Process:
    for child in psutil.Process(process.pid).children(recursive=True):
        if module in child.cmdline():
            return child
    raise AssertionError(f"no {module} process under the launcher")


def _resume_and_compare(run_dir: Path, uninterrupted: dict[str, torch.Tensor]) -> subprocess.CompletedProcess:
    resumed = train(run_dir, *COMMAND)  # unpaused: the pause only made room for the kill
    assert resumed.returncode == 0, explain(resumed)
    assert summary(run_dir)["resumed_from"], "the rerun started afresh instead of resuming"
    final = weights(run_dir / "checkpoints" / step_dir_name(STEPS))
    assert final.keys() == uninterrupted.keys()
    for name in final:
        assert torch.equal(final[name], uninterrupted[name]), name
    assert not (run_dir / LEASE_DIR).exists()
    return resumed


def _stopped_with_a_checkpoint(run_dir: Path, at_least: int) -> None:
    stopped = summary(run_dir)
    assert stopped["exit_reason"] == "preempted" and at_least <= stopped["steps"] < STEPS, stopped
    assert checkpoint.verify(run_dir / "checkpoints" / step_dir_name(stopped["steps"]))


def test_sigkill_to_the_launchers_process_group_stops_the_ranks_with_a_checkpoint(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    moment = random.randint(1, 12)  # logged steps before the kill
    launcher = _start(run_dir)
    wait_for(lambda: logged_steps(run_dir) >= moment, launcher)
    os.killpg(launcher.pid, signal.SIGKILL)  # as an OOM killer, a job timeout or `kill -9 -PGID` would
    output, _ = launcher.communicate()
    _wait_until_none_left(run_dir)
    assert re.search(r"the launcher \(PID \d+\) is gone; stopping the ranks", output), output[-4000:]
    _stopped_with_a_checkpoint(run_dir, at_least=moment)
    resumed = _resume_and_compare(run_dir, uninterrupted)
    assert f"took over the lease of {run_dir}" in resumed.stderr


def test_sigkill_to_the_agent_stops_the_ranks_and_the_launcher_reports_it(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    moment = random.randint(1, 12)
    launcher = _start(run_dir)
    wait_for(lambda: logged_steps(run_dir) >= moment, launcher)
    _child(launcher, "trainstack.train.launcher.agent").kill()
    output, _ = launcher.communicate(timeout=GRACE + 60)
    assert launcher.returncode == 75, output[-4000:]
    assert re.search(r"the rank agent \(PID \d+\) was killed by SIGKILL", output), output[-4000:]
    assert "rerun the same command to resume" in output
    assert not TORCH_LOG_LINE.search(output), output[-4000:]
    assert not _left_running(run_dir)  # the launcher let go of the lease only after the ranks ended
    assert not (run_dir / LEASE_DIR).exists()
    _stopped_with_a_checkpoint(run_dir, at_least=moment)
    _resume_and_compare(run_dir, uninterrupted)


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "afresh"])
def test_ranks_that_outlive_the_launcher_and_the_agent_keep_the_run_directory_until_they_have_saved(tmp_path, forked):
    """With the launcher and the agent both killed, a rerun is refused while the ranks still save: forked CPU ranks
    hold the lease's file the agent inherited, ranks started afresh (as GPU ranks are) lock it themselves
    (docs/training.md, "When a run dies")."""
    run_dir = tmp_path / "run"
    launcher = _start(run_dir, env={} if forked else {FORK_RANKS_ENV: "0"})
    wait_for(lambda: logged_steps(run_dir) >= 2, launcher)
    agent = _child(launcher, "trainstack.train.launcher.agent")
    ranks = agent.children()
    assert len(ranks) == 2 and all((rank.name() == "trainstack-rank") == forked for rank in ranks), ranks
    for rank in ranks:  # held mid-run, so that they cannot have stopped before the rerun looks
        rank.suspend()
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
        agent.kill()
        launcher.wait(timeout=30)  # reaped, as a shell would: a zombie's PID still reads as a live holder
        agent.wait(timeout=30)
        refused = train(run_dir, *COMMAND)
    finally:
        for rank in ranks:
            rank.resume()
    assert refused.returncode == 2, explain(refused)
    assert "whose processes still hold it while they stop (its PID is gone)" in refused.stderr, explain(refused)
    output, _ = launcher.communicate(timeout=GRACE + 60)
    assert "its agent (PID" in output and "is gone; stopping at the next log interval" in output, output[-4000:]
    _wait_until_none_left(run_dir)
    _stopped_with_a_checkpoint(run_dir, at_least=2)


def test_a_sigkilled_rank_fails_the_launch_naming_it_and_the_rerun_resumes(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    launcher = _start(run_dir, "--checkpoint-every", "5")
    wait_for(lambda: checkpoint.complete_checkpoints(run_dir / "checkpoints"), launcher)
    victim = psutil.Process(json.loads(next(run_dir.rglob(hang_pid_file(".", 1).name)).read_text())["pid"])
    # a CPU rank forked from its agent (train/launcher/forked_ranks.py), in a session of its own
    assert victim.name() == "trainstack-rank" and os.getsid(victim.pid) == victim.pid
    assert "trainstack.train.launcher.agent" in victim.parent().cmdline()
    victim.kill()
    output, _ = launcher.communicate(timeout=GRACE + 60)  # a hang guard: the peer sees the connection drop at once
    assert launcher.returncode not in (0, 75), output[-4000:]
    assert "rank 1" in output, output[-4000:]
    assert "failed (exitcode: -9) local_rank: 1" in output  # torch's line about a real crash stays
    assert not _left_running(run_dir)
    _resume_and_compare(run_dir, uninterrupted)


def _steps_served(port: int) -> float:
    """The run's trainstack_train_steps_total summed over ranks, from the exporter's /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("trainstack_train_steps_total{")
    )


def _served_steps_or_none(port: int) -> float | None:
    try:
        return _steps_served(port)
    except OSError:
        return None


def test_ctrl_c_as_the_ranks_start_is_a_stop_not_a_rank_that_failed(tmp_path):
    """A terminal's Ctrl-C while the ranks start: the SIGTERM the launcher passes on reaches a rank before its
    handler is in place (here held back, by a sitecustomize that sleeps in each rank's interpreter start, so the
    ranks start afresh rather than forked), which ends it; that is the stop the user asked for (exit 75), not rank 0
    failing."""
    run_dir, slow_start = tmp_path / "run", tmp_path / "slow_start"
    slow_start.mkdir()
    (slow_start / "sitecustomize.py").write_text(
        "import os, time\nif 'LOCAL_RANK' in os.environ and 'TORCHELASTIC_RUN_ID' in os.environ:\n    time.sleep(3)\n"
    )
    launcher = _start(run_dir, env={"PYTHONPATH": str(slow_start), FORK_RANKS_ENV: "0"})

    def ranks_started() -> bool:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if child.cmdline()[1:4] == ["-u", "-m", "trainstack.train.rank"]:  # a rank, not its agent
                    return True
            except psutil.Error:  # a process that ended meanwhile (the doctor's probes)
                continue
        return False

    wait_for(ranks_started, launcher)
    os.killpg(launcher.pid, signal.SIGINT)  # the launcher's process group, as a terminal's Ctrl-C
    output, _ = launcher.communicate(timeout=GRACE + 60)
    _wait_until_none_left(run_dir)
    assert launcher.returncode == 75, output[-4000:]
    assert "exited with code -15" not in output and "Traceback" not in output, output[-4000:]
    assert "trainstack train: stopped by SIGINT while the ranks were starting, before they could save" in output


def test_a_sigkilled_exporter_is_restarted_and_its_counters_carry_on(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    launcher = _start(run_dir, "--max-steps", "100000", exporter_port=port)
    try:
        wait_for(lambda: (_served_steps_or_none(port) or 0) >= 5, launcher)
        exporter = _child(launcher, "trainstack.monitoring.exporter")
        before = _steps_served(port)
        exporter.kill()
        exporter.wait(timeout=10)
        wait_for(lambda: _served_steps_or_none(port) is not None, launcher)
        assert _steps_served(port) >= before  # read again from the ranks' files: the count carries on
        assert _child(launcher, "trainstack.monitoring.exporter").pid != exporter.pid
    finally:
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=GRACE + 60)
    assert launcher.returncode == 75, output[-4000:]
    assert not TORCH_LOG_LINE.search(output), output[-4000:]  # a preemption: trainstack's lines only
    restarts = [line for line in output.splitlines() if "exporter" in line and "SIGKILL" in line]
    assert len(restarts) == 1, output[-4000:]
    assert output.count(f"metrics at http://127.0.0.1:{port}/metrics") == 1


def test_an_exporter_that_cannot_listen_is_retried_with_a_backoff_and_announced_only_once_it_serves():
    said: list[str] = []
    with socket.socket() as taken:  # listens, but answers no HTTP: another program on the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        url = f"http://127.0.0.1:{port}/metrics"
        exporter = SupervisedExporter(
            [
                sys.executable,
                "-m",
                "trainstack.monitoring.exporter",
                "--port",
                str(port),
                "--nvml-module",
                "trainstack.monitoring.nvml_fake",
            ],
            env=dict(os.environ),
            port=port,
            host="127.0.0.1",
            url=url,
            say=said.append,
        )
        exporter.start()
        try:
            _wait_until(lambda: len(said) >= 2)
            taken.close()  # the port is free again: the next try serves
            _wait_until(lambda: f"metrics at {url}" in said)
            health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
        finally:
            exporter.stop()
    assert said[:2] == [
        "the exporter exited with code 69 before serving; starting it again in 1 s",
        "the exporter exited with code 69 before serving; starting it again in 2 s",
    ], said
    assert said[2:] == [f"metrics at {url}"], said
    assert b'"status": "ok"' in health


def _wait_until(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
