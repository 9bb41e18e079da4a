"""Storage failures without a run: a refused write is one line naming what, where and the free space, torch's
serializer errors, the newest intact checkpoint, the rank named for a failure (full disks and read-only run
directories under real runs: tests/process/test_io_faults.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from trainstack.commands import train as train_command
from trainstack.errors import EXIT_OK, EXIT_RUNTIME
from trainstack.rundir import (
    FAILURE_FD_ENV,
    FAILURE_NOTES_ENV,
    UNSEALED_PREFIX,
    FailureNote,
    FirstFailure,
    step_dir_name,
)
from trainstack.supervisor import supervised
from trainstack.supervisor.supervised import write_report
from trainstack.train.launcher import agent
from trainstack.train.rank import checkpoint, outcome
from trainstack.train.rank.config import TrainConfig
from trainstack.write_failure import WriteFailure, write_failure


def make_checkpoint(root: Path, step: int) -> Path:
    temporary = root / (UNSEALED_PREFIX + step_dir_name(step))
    temporary.mkdir(parents=True)
    (temporary / "model.safetensors").write_bytes(bytes(64))
    checkpoint.seal(temporary, {"step": step})
    final = root / step_dir_name(step)
    checkpoint.publish(temporary, final)
    return final


# ---- the one line -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "said", "remedy"),
    [
        (errno.ENOSPC, "no space left on device", "free space there"),
        (errno.EDQUOT, "disk quota exceeded", "raise the quota"),
        (errno.EROFS, "read-only file system", "mount it read-write"),
        (errno.EACCES, "permission denied", "write access"),
        (errno.EPERM, "operation not permitted", "write access"),
    ],
)
def test_a_refused_write_is_one_line_naming_what_where_and_the_free_space(tmp_path, code, said, remedy):
    target = tmp_path / "checkpoints" / ".tmp-step-00000015"  # gone already: the free space is its parent's
    failure = write_failure(OSError(code, os.strerror(code)), "checkpoint step 15", target)
    assert isinstance(failure, WriteFailure)
    message = str(failure)
    assert message.startswith(f"{said} writing checkpoint step 15 to {target} (")
    assert " free of " in message and remedy in message and "\n" not in message


def test_the_path_the_error_names_is_where():
    failure = write_failure(
        OSError(errno.ENOSPC, "No space left", "/run/summary.json.tmp"), "the summary", Path("/run/summary.json")
    )
    assert "writing the summary to /run/summary.json.tmp (" in str(failure)


@pytest.mark.parametrize("error", [ValueError("bad"), OSError(errno.ENOENT, "missing"), RuntimeError("shape mismatch")])
def test_other_errors_are_not_storage_failures(tmp_path, error):
    assert write_failure(error, "the telemetry records", tmp_path) is None


def test_torchs_serializer_error_where_space_is_left_says_what_it_may_be(tmp_path):
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 403584 vs 403472")
    message = str(write_failure(error, "checkpoint step 15", tmp_path))
    assert message.startswith("a write cut short (a full disk, a quota or a device error) writing checkpoint step 15")
    assert message.endswith("; free space there or check the storage device")


# ---- the checkpoint a rerun resumes from --------------------------------------------------------------------
def test_the_newest_intact_checkpoint_is_named(tmp_path):
    root = tmp_path / "checkpoints"
    assert checkpoint.resume_note(root) == "no checkpoint was saved yet: a rerun starts from step 0"
    make_checkpoint(root, 5)
    newest = make_checkpoint(root, 10)
    assert checkpoint.newest_intact(root) == newest
    assert checkpoint.resume_note(root) == f"a rerun of the same command resumes from {newest} (step 10)"


def test_a_truncated_checkpoint_is_passed_over(tmp_path):
    root = tmp_path / "checkpoints"
    older = make_checkpoint(root, 5)
    (make_checkpoint(root, 10) / "model.safetensors").write_bytes(bytes(3))
    (root / ".tmp-step-00000015").mkdir()  # a save cut short: never named
    assert checkpoint.newest_intact(root) == older


# ---- which rank failed --------------------------------------------------------------------------------------
def test_a_dropped_connection_is_not_called_a_timeout():
    lost = outcome.explain_runtime_error(
        RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:4242"), TrainConfig(collective_timeout=600)
    )
    assert lost.peer_lost and "lost the connection to a peer rank" in lost.message
    assert "collective-timeout" not in lost.message


def launch_that_failed(
    tmp_path, monkeypatch, notes: dict[int, outcome.Failure | None], reported: set[int] | None = None
) -> tuple[ChildFailedError, dict[int, FailureNote]]:
    """What the agent has once these ranks failed, each having reported `notes[rank]` (None: died silently): what
    torchrun raises, naming the ranks in `reported` (all by default), and the notes the ranks left."""
    folder = tmp_path / "notes"
    folder.mkdir()
    monkeypatch.setenv(FAILURE_NOTES_ENV, str(folder))
    failures = {}
    for rank, failure in notes.items():
        if failure:
            outcome.report_failure(rank, failure)
        if reported is None or rank in reported:
            code = failure.exit_code if failure else -9
            failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="")
    return ChildFailedError("trainstack.train.rank", failures), FailureNote.read_all(folder)


# reported: torchrun names every rank that had exited when it looked, or, forking the ranks, only the first it saw
# exit, which can be the peer that lost its connection while the rank that failed still tidies up
@pytest.mark.parametrize("reported", [None, {0}], ids=["both-reported", "only-the-peer-reported"])
def test_the_agent_names_the_rank_that_failed_for_itself_not_its_peer(tmp_path, monkeypatch, reported):
    lost = outcome.Failure("lost the connection to a peer rank", 1, peer_lost=True)
    disk = outcome.Failure("no space left on device writing checkpoint step 15", EXIT_RUNTIME)
    failure, notes = launch_that_failed(tmp_path, monkeypatch, {1: disk, 0: lost}, reported)
    assert agent.first_failure(failure, notes) == FirstFailure(
        "rank 1: no space left on device writing checkpoint step 15", EXIT_RUNTIME, noted=True
    )


@pytest.mark.parametrize("survivor", ["lost", "ended"])
def test_a_rank_that_died_silently_comes_before_those_that_lost_it_or_were_ended_with_it(
    tmp_path, monkeypatch, survivor
):
    # ended: torchrun's SIGTERM to the surviving rank's process group killed its loader worker, and torch raised
    # that in the rank before the rank could stop (tests/process/test_run_lifetimes.py met it on a loaded host)
    config = TrainConfig(collective_timeout=600)
    errors = {
        "lost": RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:4242"),
        "ended": RuntimeError("DataLoader worker (pid 14396) is killed by signal: Terminated. "),
    }
    assert outcome.explain_runtime_error(errors["ended"], config) is None  # without a stop, a worker's death is a bug
    note = outcome.explain_runtime_error(errors[survivor], config, stopping=True)
    failure, notes = launch_that_failed(tmp_path, monkeypatch, {0: note, 1: None})
    assert agent.first_failure(failure, notes) == FirstFailure(
        "rank 1 exited with code -9 (its log is above)", -9, False
    )


def test_where_every_rank_only_lost_a_peer_torchruns_first_is_named_with_its_note(tmp_path, monkeypatch):
    lost = outcome.Failure("lost the connection to a peer rank", 1, peer_lost=True)
    failure, notes = launch_that_failed(tmp_path, monkeypatch, {0: lost, 1: lost}, reported={1})
    assert agent.first_failure(failure, notes) == FirstFailure("rank 1: lost the connection to a peer rank", 1, True)


def test_the_agents_report_reaches_the_launcher_whole_through_its_pipe_and_a_cut_one_is_none(monkeypatch):
    # what tells a rank that the launcher's own SIGTERM ended before its handler (a stop) from one that failed
    ended = FirstFailure("rank 0 exited with code -15 (its log is above)", -15, noted=False)

    def through_the_pipe(write) -> FirstFailure | None:
        reader, writer = os.pipe()
        monkeypatch.setenv(FAILURE_FD_ENV, str(writer))
        write(writer)
        os.close(writer)
        return train_command.read_first_failure(reader)

    assert through_the_pipe(lambda _: agent.announce(ended)) == ended
    assert through_the_pipe(lambda fd: os.write(fd, ended.to_json()[:20].encode())) is None  # the agent killed mid-way
    assert through_the_pipe(lambda _: None) is None  # no rank failed


def test_the_agents_report_goes_to_stderr_when_the_launcher_is_gone(monkeypatch, capsys):
    reader, writer = os.pipe()
    os.close(reader)  # the launcher was killed: its end of the pipe went with it
    monkeypatch.setenv(FAILURE_FD_ENV, str(writer))
    try:
        agent.announce(FirstFailure("rank 1: out of memory", 1, noted=True))
    finally:
        os.close(writer)
    assert capsys.readouterr().err == "trainstack: rank 1: out of memory\n"


def test_a_rank_leaves_its_note_only_where_an_agent_reads_it_and_a_half_written_note_is_skipped(
    tmp_path, monkeypatch, capsys
):
    disk = outcome.Failure("no space left on device", EXIT_RUNTIME)
    monkeypatch.delenv(FAILURE_NOTES_ENV, raising=False)
    outcome.report_failure(0, disk)  # started without trainstack's agent: the line on stderr only
    assert capsys.readouterr().err == "trainstack rank 0: error: no space left on device\n"
    monkeypatch.setenv(FAILURE_NOTES_ENV, str(tmp_path))
    outcome.report_failure(2, disk)
    (tmp_path / "rank-3.json").write_text('{"rank": 3, "mess')  # a rank killed while it wrote
    (note,) = FailureNote.read_all(tmp_path).values()
    assert (note.rank, note.message, note.exit_code, note.peer_lost) == (
        2,
        "no space left on device",
        EXIT_RUNTIME,
        False,
    )


def test_a_report_the_disk_refuses_is_one_line_and_exit_69(tmp_path, capsys, monkeypatch):
    def refused(run_dir):
        raise WriteFailure("no space left on device writing the report to x (0 B free of 1.0 MiB); free space there")

    newest = make_checkpoint(tmp_path / "checkpoints", 5)
    monkeypatch.setattr(supervised, "render_report", refused)
    assert write_report(tmp_path, train_command.PROGRAM, train_command.checkpoints_kept) == EXIT_RUNTIME
    line = capsys.readouterr().err.strip()
    assert line == (
        "trainstack train: error: no space left on device writing the report to x (0 B free of 1.0 MiB); "
        f"free space there, then `trainstack report {tmp_path}` writes it; the checkpoints are untouched, "
        f"the newest intact is {newest}"
    )
    monkeypatch.setattr(supervised, "render_report", lambda run_dir: run_dir / "report.html")
    assert write_report(tmp_path, train_command.PROGRAM, train_command.checkpoints_kept) == EXIT_OK
