"""Issue 31 with processes: 2 CPU ranks over gloo and a user's loop under `trainstack watch`
(tests/drivers/hang_loop.py) hang in a skipped collective, a stuck DataLoader or a blocked checkpoint write, and
the verdict names where each rank waits (the verdict on evidence folders: tests/unit/trainstack/test_hang.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import REPO, kill_tree, start, start_watch, torchrun, wait_for
from tests.helpers.stalls import C10D, entry, user, write_rank
from trainstack.hang import FR_BUFFER_ENV
from trainstack.hang_verdict import (
    analyze,
    read_verdict,
)
from trainstack.rundir import METRICS_DIR_ENV, RunDir, free_port, hang_pid_file

DRIVER = REPO / "tests" / "drivers" / "hang_loop.py"
HANG_STEP = 5  # the driver's step that hangs


# ---- 2 ranks over gloo under watch ------------------------------------------------------------------------------
def watch_hang(run_dir: Path, hang: str, env: dict | None = None, *args: str) -> dict:
    """The driver under watch with a 2 s stall threshold; the verdict once written (then the run is killed). (A
    healthy run under watch collects no evidence: test_user_loop.py.)"""
    watched = start_watch(
        run_dir,
        "--exporter-port",
        "0",
        "--no-report",
        "--",
        *torchrun(str(DRIVER), "--hang", hang, *args),
        env={"OMP_NUM_THREADS": "1", "TRAINSTACK_HANG_SECONDS": "2", **(env or {})},
    )
    verdicts = lambda: list(RunDir(run_dir).hang.glob("stall-*/verdict.json"))  # noqa: E731
    try:
        wait_for(lambda: verdicts(), watched, timeout=240)
    finally:
        kill_tree(watched)
    return json.loads(verdicts()[0].read_text())


@pytest.mark.slow
def test_a_collective_under_if_rank_0_names_the_rank_that_skipped_it(tmp_path):
    verdict = watch_hang(tmp_path / "run", "skip-collective")
    assert verdict["culprits"] == [1], verdict
    assert verdict["headline"].startswith("rank 1 has not joined all_reduce #"), verdict
    assert "(rank 0 waits in it); rank 1 is at hang_loop.py:" in verdict["headline"]
    assert "in `own_evaluation`" in verdict["headline"] and "if rank == 0:" in verdict["fix"]
    # py-spy is a dev dependency: where it may attach (ptrace), it gives the stacks; else the ranks' own dumps do
    source = "py-spy" if shutil.which("py-spy", path=os.path.dirname(sys.executable)) else "the rank's own thread"
    assert all(f"(stack from {source})" in line for line in verdict["evidence"][:2]), verdict
    assert re.search(
        r"^rank 0: .* at hang_loop\.py:\d+ in `skip_a_collective_on_rank_1`, in `all_reduce` \(torch/distributed/",
        verdict["evidence"][0],
    ), verdict  # the waiting rank's own line, not torch's, is its place
    # Six steps (0 to 5) in well under the second after which a loop writes its counts: the responder's thread wrote
    # them, where each rank stopped (trainstack/telemetry/metrics.py, CountedSeries)
    collection = json.loads(next(RunDir(tmp_path / "run").hang.glob("stall-*/collection.json")).read_text())
    assert {rank["steps"] for rank in collection["ranks"].values()} == {HANG_STEP + 1}, collection


@pytest.mark.slow
def test_a_collective_skipped_before_the_first_step_is_named_too(tmp_path):
    # No step yet: the wait counts from the ranks' start of their loops (supervisor/hang_watch.py).
    verdict = watch_hang(tmp_path / "run", "skip-first-collective")
    assert verdict["culprits"] == [1], verdict
    assert verdict["headline"].startswith("rank 1 has not joined all_reduce #"), verdict
    assert "in `own_evaluation`" in verdict["headline"], verdict
    collection = json.loads(next(RunDir(tmp_path / "run").hang.glob("stall-*/collection.json")).read_text())
    assert {rank["steps"] for rank in collection["ranks"].values()} == {0}, collection


@pytest.mark.slow
def test_a_stuck_data_loader_is_named_and_py_spy_that_cannot_attach_is_said(tmp_path):
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    verdict = watch_hang(tmp_path / "run", "loader", {"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert verdict["culprits"] == [1], verdict
    assert "rank 1 is at hang_loop.py:" in verdict["headline"] and "in `__getitem__`" in verdict["headline"]
    assert "in `__next__` (torch/utils/data/dataloader.py:" in verdict["headline"], verdict
    assert "DataLoader" in verdict["fix"]
    assert any(line.startswith("py-spy could not attach (it needs ptrace") for line in verdict["evidence"]), verdict
    assert any("stack from the rank's own thread" in line for line in verdict["evidence"]), verdict


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_a_skipped_collective_on_nccl_is_named(tmp_path):
    verdict = watch_hang(tmp_path / "run", "skip-collective", None, "--backend", "nccl")
    assert verdict["culprits"] == [1] and "has not joined all_reduce #" in verdict["headline"]


NCCL_COLLECTIVES = """
import json, torch, torch.distributed as dist
from trainstack.hang import flight_recorder
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
for _ in range(3):
    dist.all_reduce(torch.ones(4, device="cuda"))
torch.cuda.synchronize()
print(json.dumps(flight_recorder()))
dist.destroy_process_group()
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_rank_s_nccl_collectives_are_in_its_hang_evidence():
    # NCCL writes its own recorder, apart from gloo's: on an H100 the evidence first held none of its collectives.
    env = {**os.environ, FR_BUFFER_ENV: "100", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    result = subprocess.run([sys.executable, "-c", NCCL_COLLECTIVES], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    entries, error = json.loads(result.stdout.splitlines()[-1])
    assert error is None
    all_reduces = [e for e in entries if e["profiling_name"] == "nccl:all_reduce"]
    assert [e["state"] for e in all_reduces] == ["completed"] * 3, entries
    assert sorted({e["collective_seq_id"] for e in all_reduces}) == [e["collective_seq_id"] for e in all_reduces]


# ---- trainstack train -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_checkpoint_write_that_blocks_one_rank_is_named_and_the_timeout_carries_it(tmp_path):
    from tests.helpers.runs import explain, train

    result = train(
        tmp_path / "run",
        "--model",
        "tests.factories:stuck_save_gpt",
        "--max-steps",
        "50",
        "--checkpoint-every",
        "5",
        "--collective-timeout",
        "10",  # the evidence is in after TRAINSTACK_HANG_SECONDS (2 s) and the stacks' few seconds
        timeout=240,
        env={"TRAINSTACK_TEST_STUCK_SAVE_RANK": "1", "TRAINSTACK_HANG_SECONDS": "2"},
    )
    assert result.returncode == 1, explain(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("trainstack train: rank 0: a collective waited longer than --collective-timeout 10 s"), (
        explain(result)
    )
    assert "; where the ranks waited: rank 1 has not joined " in last and "state_dict`" in last, last
    assert re.search(r"in `(\w+\.)?save` \(checkpointer\.py:\d+\)", last), last
    verdict = read_verdict(RunDir(tmp_path / "run").hang)  # the latest: start-up may have had one of its own
    assert verdict is not None and verdict.culprits == [1] and "checkpoint" in verdict.fix, verdict
    # The stall heads the card and is kept in summary.json: the run ended in it, whatever its steps showed before.
    ended = json.loads(RunDir(tmp_path / "run").summary.read_text())
    assert ended["exit_reason"] == "failed" and ended["hang"]["culprits"] == [1], ended
    assert ended["hang"]["headline"] == verdict.headline, ended
    assert re.search(r"/hang/stall-\d+$", ended["hang"]["evidence_dir"]), ended
    assert f"trainstack train: HUNG  {verdict.headline}\n" in result.stderr, explain(result)


@pytest.mark.slow
def test_a_rank_that_never_gets_its_data_is_named_before_any_rank_reaches_its_loop(tmp_path):
    # Rank 0 fills the datasets cache first and never returns; rank 1 waits for it at Accelerate's barrier. Neither
    # has a monitor yet: the ranks answer from their start, and the threshold there is half the collective timeout.
    run_dir = tmp_path / "run"
    launched = start(run_dir, "--dataset", "tests.factories:unreadable_on_rank_0", "--collective-timeout", "30")
    try:
        wait_for(lambda: list(RunDir(run_dir).hang.glob("stall-*/verdict.json")), launched, timeout=180)
        verdict = read_verdict(RunDir(run_dir).hang)
    finally:
        kill_tree(launched)
    assert verdict is not None and verdict.culprits == [0], verdict
    assert "rank 0 is at __init__.py:" in verdict.headline and "in `unreadable_on_rank_0`" in verdict.headline
    assert "preparing its data or model" in verdict.fix, verdict
    assert all(
        line.startswith(f"rank {r}: starting (before its loop), ") for r, line in enumerate(verdict.evidence[:2])
    )
    assert "in a collective" in verdict.headline or "(rank 1 waits in it)" in verdict.headline, verdict


# ---- faulthandler: a rank that cannot answer ---------------------------------------------------------------------
@pytest.mark.slow
def test_faulthandler_gives_the_stack_of_a_rank_that_does_not_answer(tmp_path):
    import subprocess

    from trainstack.supervisor.hang_watch import HangWatch

    metrics = tmp_path / "metrics"
    metrics.mkdir()
    script = tmp_path / "stuck.py"
    script.write_text(
        "import sys, time\nfrom trainstack.hang import start_responder\n"
        f"assert start_responder(3, {str(metrics)!r})\n"
        # 'ready' from inside stuck() and on the sleep's line: the stack is taken once the parent reads it, which
        # under load can be before the child's next line starts
        "def stuck():\n    print('ready', flush=True); time.sleep(3600)\nstuck()\n"
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        stall = tmp_path / "stall-1"
        stall.mkdir()
        HangWatch(RunDir(tmp_path), metrics, print).faulthandler(stall, "3", child.pid)
    finally:
        child.kill()
        child.wait()
    write_rank(stall, 0, [user(40), C10D], [entry(1), entry(2)])
    hang = analyze(stall)
    assert hang.headline == (
        "rank 0 waits in all_reduce #2 of process group 0; rank 3 gave no Flight Recorder "
        "entries: rank 3 is at stuck.py:5 in `stuck`"
    ), hang
    assert hang.evidence[-1].endswith("(stack from faulthandler)") and hang.culprits == [3]


LONE_RANK_START = r"""
import argparse, sys
import trainstack.train.rank.trainer as rank
from trainstack.train.rank.config import add_arguments, from_sources

parser = argparse.ArgumentParser()
add_arguments(parser)
trainer = rank.Trainer(from_sources(parser.parse_args(sys.argv[1:]), on_cuda=False))
"""


@pytest.mark.slow
def test_a_lone_rank_s_start_up_is_not_watched(tmp_path):
    # No peer waits on a lone rank under a timeout, so a long start-up (a big dataset to tokenize) is no stall.
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = {**os.environ, METRICS_DIR_ENV: str(metrics)}
    flags = ["--output-dir", str(tmp_path / "run"), "--num-workers", "0", "--max-steps", "1"]
    started = subprocess.run([sys.executable, "-c", LONE_RANK_START, *flags], cwd=REPO, env=env, timeout=120)
    assert started.returncode == 0
    assert not hang_pid_file(metrics, 0).exists()


@pytest.mark.slow
def test_a_watch_that_fails_says_so_once_and_the_run_goes_on(tmp_path, monkeypatch):
    """The loop that passes signals on and outlives the command is never ended by the hang watch's own failure."""
    from trainstack.supervisor import supervised

    def failing(watch) -> None:
        raise RuntimeError("Read beyond file size detected, file is corrupted.")

    monkeypatch.setattr(supervised.HangWatch, "poll", failing)
    said: list[str] = []
    run = supervised.SupervisedRun(RunDir(tmp_path), 0, None, supervised.AnyCommand(), said.append)
    run.start([sys.executable, "-c", "import time; time.sleep(1.5)"], dict(os.environ))
    assert run.wait() == 0
    assert said == [
        "hang evidence off for the rest of this run: the watch failed "
        "(RuntimeError: Read beyond file size detected, file is corrupted.)"
    ]
