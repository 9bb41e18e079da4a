"""The launcher's verdict without starting a rank: how the ranks' exit status, rank 0's summary.json and a
SIGTERM become `trainstack train`'s exit code and final line (commands/train.py, train/launcher/agent.py), and how
a rerun of a completed run is recognised and changes nothing. tests/process/test_train_*.py check the same with real ranks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from trainstack.commands.cli import main
from trainstack.commands.train import Launch, completed_before
from trainstack.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from trainstack.rundir import FAILURE_NOTES_ENV, RunDir, write_summary
from trainstack.train.launcher import agent
from trainstack.train.launcher.launch_config import LaunchConfig
from trainstack.train.rank import checkpoint, outcome
from trainstack.train.rank.config import TrainConfig

# ---- the launcher's exit code and final line (Launch.outcome) ------------------------------------------------


def launch(run_dir: Path, node_rank: int = 0, stopped: bool = False) -> Launch:
    world = LaunchConfig(
        nproc_per_node=2,
        nnodes=2,
        node_rank=node_rank,
        master_addr="127.0.0.1",
        master_port=29500,
        use_cpu=True,
        exporter_port=0,
        exporter_host="127.0.0.1",
        rendezvous_timeout=1.0,
    )
    launched = Launch(TrainConfig(output_dir=str(run_dir)), world, None, "this-launch")
    launched.started = time.time() - 60  # Launch.run sets it as the ranks start
    if stopped:
        launched.supervised.on_signal(signal.SIGTERM, None)
    return launched


def rank_0_wrote(
    run_dir: Path,
    exit_reason: str,
    exit_code: int,
    run_id: str = "this-launch",
    steps: int = 7,
    written: float | None = None,
) -> Path:
    path = RunDir(run_dir).summary
    write_summary(path, {"run_id": run_id, "steps": steps, "exit_reason": exit_reason, "exit_code": exit_code})
    if written is not None:
        os.utime(path, (written, written))
    return path


@pytest.mark.parametrize(
    ("exit_reason", "exit_code", "ranks_exit", "expected"),
    [
        ("completed", EXIT_OK, 0, EXIT_OK),
        ("preempted", EXIT_PREEMPTED, EXIT_PREEMPTED, EXIT_PREEMPTED),
        ("failed", EXIT_FAILED, 1, EXIT_FAILED),
        ("failed", EXIT_CONFIG, 1, EXIT_CONFIG),  # rank 0's own verdict: a config error stays 2, not the agent's 1
        ("completed", EXIT_OK, 1, EXIT_FAILED),  # rank 0 finished, but another rank did not exit cleanly
    ],
)
def test_node_0_takes_rank_0s_verdict_from_this_launchs_summary(
    tmp_path, capsys, exit_reason, exit_code, ranks_exit, expected
):
    summary = rank_0_wrote(tmp_path, exit_reason, exit_code)
    assert launch(tmp_path).outcome(ranks_exit) == expected
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"trainstack train: {exit_reason} after 7 steps; {summary}"
    resume_hint = "trainstack train: checkpoint saved; rerun the same command to resume"
    assert lines[1:] == ([resume_hint] if exit_reason == "preempted" else [])


@pytest.mark.parametrize("stale", ["another run's id", "written before this launch started"])
@pytest.mark.parametrize(
    ("ranks_exit", "expected"), [(0, EXIT_OK), (EXIT_PREEMPTED, EXIT_PREEMPTED), (1, EXIT_FAILED), (-9, EXIT_FAILED)]
)
def test_a_summary_this_launch_did_not_write_is_ignored(tmp_path, capsys, stale, ranks_exit, expected):
    if stale == "another run's id":
        rank_0_wrote(tmp_path, "completed", EXIT_OK, run_id="an-earlier-run")
    else:  # the same TRAINSTACK_RUN_ID relaunched: the file is the previous launch's
        rank_0_wrote(tmp_path, "completed", EXIT_OK, written=time.time() - 3600)
    assert launch(tmp_path).outcome(ranks_exit) == expected
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("node_rank", "stopped", "ranks_exit", "expected"),
    [
        (0, False, -9, EXIT_FAILED),  # rank 0 was killed before it wrote a summary
        (1, False, 0, EXIT_OK),
        (1, False, EXIT_PREEMPTED, EXIT_PREEMPTED),  # another node's SIGTERM: its ranks agreed with ours to stop
        (1, True, 0, EXIT_PREEMPTED),  # SIGTERMed here: the run stopped early, whatever the ranks exit with
        (1, True, EXIT_PREEMPTED, EXIT_PREEMPTED),
        (1, True, 1, EXIT_FAILED),
        (1, False, EXIT_CONFIG, EXIT_FAILED),  # without rank 0's summary, any other status is a failure
    ],
)
def test_without_rank_0s_summary_the_ranks_exit_status_decides(
    tmp_path, capsys, node_rank, stopped, ranks_exit, expected
):
    if node_rank:  # node 0 of the same run wrote it to the shared volume: not this node's verdict
        rank_0_wrote(tmp_path, "failed", EXIT_CONFIG)
    assert launch(tmp_path, node_rank, stopped).outcome(ranks_exit) == expected
    assert capsys.readouterr().err == ""


# ---- the per-node agent: torchrun's failure as one line and an exit code (agent.run) ------------------------


def failure(*exitcodes: int) -> ChildFailedError:
    """Ranks 0, 1, ... failed with these codes, in that order."""
    failures = {}
    for rank, code in enumerate(exitcodes):
        failures[rank] = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="<N/A>")
        failures[rank].timestamp = 1000 + rank
    return ChildFailedError("trainstack.train.rank", failures)


def agent_exit(monkeypatch, raised: BaseException | None, ranks_note=lambda: None) -> int:
    """agent.run() over a launch whose ranks leave their notes (`ranks_note`), then fail as torchrun says (`raised`)."""

    def accelerate_launch():
        ranks_note()
        if raised:
            raise raised

    monkeypatch.setattr(agent, "main", accelerate_launch)
    monkeypatch.setenv(FAILURE_NOTES_ENV, "")  # restored (unset) after the test, whatever run() sets
    # The agent's watch on its launcher and the supervisor PID it hands its ranks are
    # tests/process/test_run_lifetimes.py's concern: here they would watch pytest's parent and leave the PID in this
    # process's environment.
    monkeypatch.setattr(agent, "watch_supervisor", lambda on_gone: None)
    monkeypatch.setenv(agent.SUPERVISOR_PID_ENV, "")  # restored (unset) after the test, whatever run() sets
    return agent.run()


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (None, 0, ""),
        (failure(EXIT_PREEMPTED, EXIT_PREEMPTED), EXIT_PREEMPTED, ""),  # every rank stopped after the checkpoint
        # a rank still tearing down when torchrun ends the others with SIGTERM after the first one's exit 75
        (failure(-15, EXIT_PREEMPTED), EXIT_PREEMPTED, ""),
        (failure(-9, EXIT_PREEMPTED), 1, "trainstack: rank 0 exited with code -9 (its log is above)"),  # not a stop
        (failure(3, 1), 3, "trainstack: rank 0 exited with code 3 (its log is above)"),  # the first failure counts
        (failure(-9), 1, "trainstack: rank 0 exited with code -9 (its log is above)"),  # killed by a signal
        (subprocess.CalledProcessError(4, ["torchrun"]), 4, ""),
        (subprocess.CalledProcessError(-15, ["torchrun"]), 1, ""),
    ],
)
def test_the_agent_turns_accelerates_failure_into_an_exit_code_and_at_most_one_line(
    monkeypatch, capsys, raised, code, line
):
    assert agent_exit(monkeypatch, raised) == code
    assert capsys.readouterr().err == (line + "\n" if line else "")


def test_the_agent_names_the_rank_that_failed_first(monkeypatch, capsys):
    raised = failure(1, 5)
    raised.failures[1].timestamp = 10  # rank 1 went first; rank 0 exited 1 after it, from the broken collective
    assert agent_exit(monkeypatch, raised) == 5
    assert capsys.readouterr().err == "trainstack: rank 1 exited with code 5 (its log is above)\n"


def test_the_agent_reads_every_ranks_note_not_only_those_torchrun_reports(monkeypatch, capsys):
    def ranks_note():
        outcome.report_failure(1, outcome.Failure("no space left on device writing checkpoint step 10", 69))
        outcome.report_failure(0, outcome.Failure("lost the connection to a peer rank", 1, peer_lost=True))
        notes_folder.append(Path(os.environ[FAILURE_NOTES_ENV]))

    notes_folder: list[Path] = []
    # torchrun, forking the ranks, reports the first it saw exit alone: here the peer, while rank 1 still tidied up
    assert agent_exit(monkeypatch, failure(1), ranks_note) == 69
    assert capsys.readouterr().err.splitlines()[-1] == (
        "trainstack: rank 1: no space left on device writing checkpoint step 10"
    )
    assert not notes_folder[0].exists()  # the agent removes its folder


def test_a_rank_that_stopped_is_not_a_preemption_where_another_failed_unreported(monkeypatch, capsys):
    def rank_1_fails():
        outcome.report_failure(1, outcome.Failure("no space left on device writing checkpoint step 10", 69))

    # rank 0 reached the agreed stop and exited 75 within the poll where rank 1 failed; torchrun reports rank 0
    assert agent_exit(monkeypatch, failure(EXIT_PREEMPTED), rank_1_fails) == 69
    assert capsys.readouterr().err.splitlines()[-1] == (
        "trainstack: rank 1: no space left on device writing checkpoint step 10"
    )


# ---- a completed run (completed_before) -------------------------------------------------------------------------


def completed_run(run_dir: Path, steps: int = 4, **config) -> TrainConfig:
    """What a run that trained `steps` and completed leaves behind: its config, summary and last checkpoint."""
    finished = TrainConfig(output_dir=str(run_dir), max_steps=steps, **config)
    layout = RunDir(run_dir)
    layout.checkpoints.mkdir(parents=True)
    finished.save(layout.config)
    write_summary(
        layout.summary, {"run_id": "finished", "steps": steps, "exit_reason": "completed", "exit_code": EXIT_OK}
    )
    save_checkpoint(layout, steps)
    return finished


def save_checkpoint(layout: RunDir, step: int) -> Path:
    folder = layout.unsealed_checkpoint(step)
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights at %d" % step)
    checkpoint.seal(folder, {"step": step})
    checkpoint.publish(folder, layout.checkpoint(step))
    return layout.checkpoint(step)


def test_rerunning_the_command_that_completed_a_run_is_recognised(tmp_path):
    finished = completed_run(tmp_path)
    assert completed_before(finished) == (
        f"{tmp_path} already holds a completed run (4 steps, run finished); nothing changed: raise --max-steps or "
        "--epochs to train further, or choose another --output-dir"
    )
    assert completed_before(TrainConfig(output_dir=str(tmp_path), max_steps=3))  # a lower step limit: also done


@pytest.mark.parametrize(
    "change",
    [
        "higher --max-steps",
        "--epochs",
        "--resume never",
        "--resume PATH",
        "not completed",
        "trained further",
        "no checkpoint",
        "no summary",
        "unreadable summary",
        "no config",
    ],
)
def test_anything_else_is_not_a_completed_run(tmp_path, change):
    finished = completed_run(tmp_path)
    layout = RunDir(tmp_path)
    rerun = {
        "higher --max-steps": dict(max_steps=5),
        "--epochs": dict(max_steps=4, epochs=1),
        "--resume never": dict(resume="never"),
        "--resume PATH": dict(resume=str(layout.checkpoint(4))),
    }.get(change, {})
    if change == "not completed":
        write_summary(
            layout.summary, {"run_id": "finished", "steps": 4, "exit_reason": "preempted", "exit_code": EXIT_PREEMPTED}
        )
    elif change == "trained further":  # killed after a later checkpoint, before a newer summary
        save_checkpoint(layout, 6)
    elif change == "no checkpoint":
        shutil.rmtree(layout.checkpoints)
    elif change == "no summary":
        layout.summary.unlink()
    elif change == "unreadable summary":
        layout.summary.write_text("{not json")
    elif change == "no config":
        layout.config.unlink()
    assert completed_before(TrainConfig(**{**finished.to_dict(), **rerun})) is None


def test_a_rerun_of_a_completed_run_says_so_exits_0_and_changes_no_byte(tmp_path, capsys):
    run_dir = tmp_path / "run"
    completed_run(run_dir)
    before = {str(p): p.read_bytes() if p.is_file() else None for p in sorted(run_dir.rglob("*"))}
    callers_handler = signal.getsignal(signal.SIGTERM)
    assert main(["train", "--output-dir", str(run_dir), "--max-steps", "4", "--exporter-port", "0"]) == EXIT_OK
    assert signal.getsignal(signal.SIGTERM) is callers_handler  # the launch's own handler ends with the launch
    assert capsys.readouterr().err.splitlines() == [
        f"trainstack train: {run_dir} already holds a completed run (4 steps, run finished); nothing changed: "
        "raise --max-steps or --epochs to train further, or choose another --output-dir"
    ]
    assert {str(p): p.read_bytes() if p.is_file() else None for p in sorted(run_dir.rglob("*"))} == before
