"""A full disk, a read-only run directory or a refused write: one line naming what, where and the free space,
the checkpoint a rerun resumes from, exit 69, nothing half-written left; the rank that failed is named.

The full disk is a small tmpfs where this user may mount one (root, as in CI); where it cannot, those tests skip
and `disk_full_gpt` injects the same ENOSPC into a checkpoint, so the path is still covered.
"""

from __future__ import annotations

import errno
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import explain, summary, train
from trainstack.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME
from trainstack.monitor import Monitor
from trainstack.rundir import METRICS_DIR_ENV, step_dir_name
from trainstack.telemetry.device import RankIdentity
from trainstack.train.rank import checkpoint
from trainstack.write_failure import WriteFailure, write_atomically, write_failure

# One checkpoint of the default model is ~4.8 MiB: two fit in 12 MiB beside the run's other files, a third does not.
TWO_CHECKPOINTS = "12m"
QUICK = ["--num-workers", "0", "--checkpoint-every", "5", "--keep-checkpoints", "10"]


@contextmanager
def tmpfs(where: Path, size: str):
    """A file system of `size` at `where`, unmounted on the way out; the test skips where none can be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}): needs root; "
            "test_injected_disk_full_names_rank_1 covers the same path"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def fill(where: Path) -> None:
    """Writes zeros into `where` until its file system refuses more."""
    with (where / "filler").open("wb", buffering=0) as filler:  # unbuffered: closing has nothing left to write
        try:
            while True:
                filler.write(bytes(1 << 16))
        except OSError as full:
            assert full.errno == errno.ENOSPC


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


@pytest.mark.slow  # mounts a tmpfs (mount(8) is a process)
def test_torchs_serializer_error_on_a_full_disk_is_no_space(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        fill(disk)
        error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 403584 vs 403472")
        message = str(write_failure(error, "checkpoint step 15", disk / "step"))
    assert message.startswith(f"no space left on device writing checkpoint step 15 to {disk / 'step'} (")
    assert "free of 1.0 MiB" in message


@pytest.mark.slow  # mounts a tmpfs (mount(8) is a process)
def test_an_atomic_write_on_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        summary_path = disk / "summary.json"
        summary_path.write_text("old")
        fill(disk)
        with pytest.raises(WriteFailure, match=r"^no space left on device writing the summary to "):
            write_atomically(summary_path, "x" * (1 << 20), "the summary")
        assert summary_path.read_text() == "old"
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "summary.json"]


@pytest.mark.slow  # mounts a tmpfs (mount(8) is a process)
def test_an_atomic_write_on_a_read_only_file_system_says_so(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        remount(disk, "ro")
        with pytest.raises(WriteFailure, match="^read-only file system writing the report to .*mount it read-write"):
            write_atomically(disk / "report.html", "<html>", "the report")


@pytest.mark.slow  # mounts a tmpfs (mount(8) is a process)
def test_telemetry_on_a_full_disk_is_a_write_failure_and_closes_quietly(tmp_path, monkeypatch):
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    identity = RankIdentity(
        rank=0,
        local_rank=0,
        node="n",
        uuid="",
        run_id="r",
        world_size=1,
        nodes=1,
        mixed_precision="no",
        model="m",
        dataset="d",
    )
    with tmpfs(tmp_path / "disk", "1m") as disk:
        monitor = Monitor(disk, identity, 1.0, None, torch.device("cpu"))
        fill(disk)
        records = disk / "telemetry" / "rank-0.jsonl"
        with pytest.raises(WriteFailure, match=f"^no space left on device writing the telemetry records to {records}"):
            for _ in range(1, 100):  # the first records still fit in the file's last page
                monitor.step(4, tokens=40, loss=2.0, lr=0.1)
                monitor.flush()
        monitor.close()  # the record that failed is still buffered: closing must not raise it again


# ---- for real, on 2 CPU ranks -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_disk_that_fills_during_a_checkpoint_ends_in_one_line_and_resumes_once_freed(tmp_path):
    with tmpfs(tmp_path / "disk", TWO_CHECKPOINTS) as disk:
        run_dir = disk / "run"
        result = train(run_dir, "--max-steps", "20", *QUICK, timeout=400)
        assert result.returncode == EXIT_RUNTIME, explain(result)
        newest = run_dir / "checkpoints" / step_dir_name(10)
        # Rank 0 writes the model, rank 1 only its RNG state: either may meet the full disk first, and the one named
        # is a rank that failed for itself, never the peer that then lost its connection. The peer's own write may
        # fail too, and where rank 0 removed its half-written checkpoint first, the peer reads space left (one CI
        # run: 1.6 MiB of 12): its torch error no longer says which, and its line says what it may be. Which of the
        # two reports first is up to the scheduler; the first to meet the full disk read it full.
        cut_short = "a write cut short (a full disk, a quota or a device error)"
        named = re.match(
            rf"trainstack train: rank (\d): (no space left on device|{re.escape(cut_short)}) writing checkpoint step 15 "
            rf"to .* \(.* free of 12\.0 MiB\); free space there.*; a rerun of the same command resumes from "
            rf"{re.escape(str(newest))} \(step 10\)$",
            last_line(result.stderr),
        )
        assert named, explain(result)
        peer = 1 - int(named[1])
        assert any(
            f"trainstack rank {peer}: error: {said}" in result.stderr
            for said in ("lost the connection to a peer rank", "no space left on device", cut_short)
        ), explain(result)
        assert re.search(
            r"trainstack rank \d: error: no space left on device writing checkpoint step 15 ", result.stderr
        )
        assert "Traceback" not in result.stderr and "collective-timeout" not in result.stderr, explain(result)
        checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        assert checkpoints == [step_dir_name(5), step_dir_name(10)]  # the half-written step 15 is gone
        for folder in checkpoints:
            checkpoint.verify(run_dir / "checkpoints" / folder)
        failed = summary(run_dir)
        assert (failed["exit_reason"], failed["exit_code"], failed["steps"]) == ("failed", EXIT_RUNTIME, 15)
        assert not list(run_dir.glob("*.tmp"))

        remount(disk, "size=64m")  # space freed: the same command resumes from step 10
        resumed = train(run_dir, "--max-steps", "20", *QUICK, timeout=400)
        assert resumed.returncode == EXIT_OK, explain(resumed)
        done = summary(run_dir)
        assert (done["resumed_from"], done["steps"]) == (str(newest), 20)


@pytest.mark.slow
def test_injected_disk_full_names_rank_1(tmp_path):
    """Rank 1 fails first; rank 0, which only loses its peer, writes the summary: the launcher still names
    rank 1, its error, and exits 69."""
    full = {"TRAINSTACK_TEST_DISK_FULL_RANK": "1", "TRAINSTACK_TEST_DISK_FULL_AFTER": "1"}
    run_dir = tmp_path / "run"
    result = train(
        run_dir, "--model", "tests.factories:disk_full_gpt", "--max-steps", "12", *QUICK, env=full, timeout=400
    )
    assert result.returncode == EXIT_RUNTIME, explain(result)
    newest = run_dir / "checkpoints" / step_dir_name(5)
    assert last_line(result.stderr).startswith(
        "trainstack train: rank 1: no space left on device writing checkpoint step 10 to "
    ), explain(result)
    assert last_line(result.stderr).endswith(f"resumes from {newest} (step 5)")
    assert "Traceback" not in result.stderr and "collective-timeout" not in result.stderr, explain(result)
    # Rank 1 leaves the step-10 folder to rank 0, which may be writing there; whether rank 0 removes it or is ended
    # first, the launcher removes it once the ranks are gone
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [step_dir_name(5)]
    checkpoint.verify(newest)


@pytest.mark.slow
def test_a_read_only_run_directory_is_refused_at_start_with_exit_2(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "run").mkdir()
        remount(disk, "ro")
        result = train(disk / "run", "--max-steps", "4", "--num-workers", "0")
    assert result.returncode == EXIT_CONFIG, explain(result)
    assert result.stderr.strip() == (
        f"trainstack train: error: --output-dir {disk / 'run'}: {disk / 'run'} is on a "
        "read-only file system; choose another path"
    ), explain(result)
