"""`trainstack watch` instruments the ranks it starts with no line of the script changed (trainstack/auto/), here
on a plain DDP loop (tests/drivers/plain_ddp.py, a BatchNorm model on 2 CPU ranks over gloo under torchrun):
`--no-auto` leaves the loop unjudged; a script that calls trainstack.monitor.start itself is recorded once; a
script's own DDP communication hook keeps working; the standalone pytorch_lightning's Trainer gets trainstack's
callback; an instrumentation that fails costs the run one line; a process that is no rank is left as it was; a
collective the script binds to its own name at import is still timed. How the plain loop, the same loop on FSDP2,
and the Trainers of `lightning.pytorch` and transformers are recorded, and the verdicts each gets (healthy, a slow
loader, a straggler slowed in its forward, after its step or in its loader), are tests/timing/test_watched_matrix.py's:
one launch of each serves both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO, explain, run_watched, torchrun
from trainstack.auto import BOOTSTRAP_DIR
from trainstack.auto.instrument import FAIL_ENV
from trainstack.record import read_launches
from trainstack.rundir import RUN_DIR_ENV, RunDir
from trainstack.telemetry import collectives

pytestmark = pytest.mark.slow

DRIVER = str(REPO / "tests" / "drivers" / "plain_ddp.py")
QUIET = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}


def watched(
    run_dir: Path, mode: str, *flags: str, steps: int, env: dict | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    """The driver in `mode` under `trainstack watch`: its summary.json and the finished watch."""
    done = run_watched(run_dir, *torchrun(DRIVER, mode, str(steps)), flags=flags, env={**QUIET, **(env or {})})
    assert done.returncode == 0, explain(done)
    return json.loads(RunDir(run_dir).summary.read_text()), done


def test_no_auto_leaves_the_loop_unjudged(tmp_path):
    summary, done = watched(tmp_path / "run", "slow-loader", "--no-auto", steps=5)
    assert summary["judged"] is False and "NOT JUDGED" in done.stderr
    assert not RunDir(tmp_path / "run").all_rank_records()


def test_a_script_that_calls_the_monitor_itself_is_recorded_once(tmp_path):
    watched(tmp_path / "run", "monitored", steps=20)
    for rank in (0, 1):
        (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(rank))  # one segment_started: the script's
        steps = [record.step for record in launch.records]
        assert steps == sorted(set(steps)) and steps[-1] == 20, steps  # one monitor's steps, not two interleaved


def test_a_scripts_own_ddp_communication_hook_keeps_working_and_is_timed(tmp_path):
    _, done = watched(tmp_path / "run", "own-comm-hook", steps=20)
    counted = [int(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("COUNTED_BUCKETS")]
    assert len(counted) == 2 and min(counted) >= 20, done.stdout  # each rank's hook reduced every step's buckets
    for rank in (0, 1):
        (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(rank))
        assert launch.records[-1].step == 20
        # the timing takes no hook of its own: the script's all-reduce is timed
        assert all(record.comm_seconds and record.comm_buckets for record in launch.records)


def test_a_trainer_of_the_standalone_pytorch_lightning_gets_trainstacks_callback_by_itself(tmp_path):
    """Lightning's Trainer from the standalone `pytorch_lightning` package, launched by Lightning itself (`python
    script.py`, devices=2), with no trainstack line: each rank recorded once, by the callback watch added. The
    `lightning.pytorch` and transformers Trainers are tests/timing/test_watched_matrix.py's."""
    pytest.importorskip("pytorch_lightning")
    steps = 20
    command = [sys.executable, str(REPO / "tests" / "drivers" / "lightning_plain.py"), str(steps), "pytorch_lightning"]
    done = run_watched(tmp_path / "run", *command, env={**QUIET, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert done.returncode == 0, explain(done)
    assert "automatic instrumentation off" not in done.stderr, done.stderr
    summary = json.loads(RunDir(tmp_path / "run").summary.read_text())
    assert summary["judged"] is True and summary["world_size"] == 2
    for rank in (0, 1):
        (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(rank))  # one monitor: the callback's
        assert launch.records[-1].step == steps and launch.ended is not None


def test_an_instrumentation_that_fails_costs_one_line_and_never_the_run(tmp_path):
    summary, done = watched(tmp_path / "run", "slow-loader", steps=5, env={FAIL_ENV: "1"})
    lines = [line for line in done.stderr.splitlines() if "automatic instrumentation off" in line]
    assert sorted(line.split(":")[1] for line in lines) == [" rank 0", " rank 1"], done.stderr  # once per rank
    assert "failing on purpose" in lines[0]
    assert summary["exit_code"] == 0 and summary["judged"] is False


def test_a_process_that_is_no_rank_is_left_as_it_was(tmp_path):
    """`python -c` under the start-up hook: it imports torch and steps an optimizer, yet no records are started,
    nothing is said, and a sitecustomize the hook hid still runs."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['HIDDEN_SITECUSTOMIZE_RAN'] = 'yes'\n")
    code = (
        "import os, torch\n"
        "p = torch.nn.Parameter(torch.ones(1)); o = torch.optim.SGD([p], lr=0.1)\n"
        "p.sum().backward(); o.step()\n"
        "print(os.environ['HIDDEN_SITECUSTOMIZE_RAN'])\n"
    )
    env = {
        **os.environ,
        RUN_DIR_ENV: str(tmp_path / "run"),
        "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(other)]),
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("yes\n", "")
    assert not (tmp_path / "run").exists()


def test_a_collective_the_script_binds_to_its_own_name_at_import_is_the_timed_one(tmp_path):
    """watch wraps torch.distributed's collectives as torch is imported: a script's `from torch.distributed import
    all_reduce`, bound long before its rank's monitor starts, still reaches the wrapper that books the wait."""
    code = "from torch.distributed import all_reduce\nprint(all_reduce.__code__.co_filename)\n"
    env = {**os.environ, RUN_DIR_ENV: str(tmp_path / "run"), "PYTHONPATH": str(BOOTSTRAP_DIR)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == collectives.__file__, done.stdout
