"""`trainstack watch -- COMMAND` without starting one: no command, the separator, a command that cannot start, a
death by signal, an earlier record set aside (commands under watch: tests/process/test_watch.py)."""

from __future__ import annotations

import argparse
import json
import signal

import pytest

from trainstack.commands.watch import Watch, command_of, exit_status
from trainstack.errors import ConfigError
from trainstack.rundir import LOG_EVERY_ENV, RUN_ID_ENV, RunDir


# ---- without a process ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [[], ["--"]])
def test_no_command_is_refused(given):
    with pytest.raises(ConfigError, match=r"^no command to watch: put it after --"):
        command_of(argparse.Namespace(watched=given))


def test_the_separator_is_dropped_and_the_rest_kept_as_given():
    assert command_of(argparse.Namespace(watched=["--", "python", "-c", "pass", "--", "x"])) == [
        "python",
        "-c",
        "pass",
        "--",
        "x",
    ]


def test_a_command_that_cannot_start_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="^command not found: no-such-trainer is not on PATH; check its spelling"):
        command_of(argparse.Namespace(watched=["--", "no-such-trainer"]))
    with pytest.raises(ConfigError, match=f"^command not found: {tmp_path}/train.sh does not exist"):
        command_of(argparse.Namespace(watched=["--", str(tmp_path / "train.sh")]))
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(ConfigError, match=r"is not executable: chmod \+x it, or name its interpreter"):
        command_of(argparse.Namespace(watched=["--", str(tmp_path / "train.py")]))


def test_a_death_by_signal_is_reported_as_a_shell_does():
    assert [exit_status(code) for code in (0, 3, -signal.SIGTERM, -signal.SIGKILL)] == [0, 3, 143, 137]


@pytest.mark.parametrize("named_run, moved", [(False, True), (True, False)])
def test_an_earlier_record_is_set_aside_unless_the_run_is_named(tmp_path, monkeypatch, named_run, moved):
    """TRAINSTACK_RUN_ID names a job's run (its pods share it): a restarted pod appends to the record. Either way
    the node records the environment the command gets."""
    run_dir = RunDir(tmp_path / "run")
    earlier = {
        run_dir.rank_records(3): b'{"time": 1.0}\n',
        run_dir.gpu_log: b'{"time": 1.0, "gpu": 0}\n',
        run_dir.report: b"<html>",
        run_dir.environment(1): b'{"variables": {"NCCL_ALGO": "Tree"}}',
    }
    for path, data in earlier.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    if named_run:
        monkeypatch.setenv(RUN_ID_ENV, "job-uid")
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    watch = Watch(["true"], argparse.Namespace(auto=True, log_every=3), run_dir, 0, "this-run", None, exporter_port=0)
    watch.prepare_run_dir()
    aside = run_dir.previous("this-run").path
    assert {path: path.exists() for path in earlier} == dict.fromkeys(earlier, not moved)
    assert {(aside / path.relative_to(run_dir.path)).exists() for path in earlier} == {moved}
    assert run_dir.node_metrics(0).is_dir()
    # this node's environment, as the command gets it: NCCL's variables and the versions, never a secret
    recorded = json.loads(run_dir.environment(0).read_text())
    assert recorded["variables"]["NCCL_ALGO"] == "Ring" and "HF_TOKEN" not in recorded["variables"]
    assert watch.command_environment()[LOG_EVERY_ENV] == "3"  # --log-every, for the ranks' monitors
    assert "hf_secret" not in run_dir.environment(0).read_text()
    assert recorded["versions"]["torch"] and recorded["versions"]["trainstack"]
