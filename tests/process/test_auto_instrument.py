"""`trainstack watch` instruments the ranks it starts with no line of the script changed (trainstack/auto/): a plain
DDP loop (tests/drivers/plain_ddp.py, a BatchNorm model on 2 CPU ranks over gloo under torchrun) is recorded per rank
and judged, on FSDP2 too; transformers' and Lightning's Trainers get trainstack's callback; `--no-auto` leaves the
loop unjudged; a script that calls trainstack.monitor.start itself is recorded once; a script's own DDP
communication hook keeps working; an instrumentation that fails costs the run one line; a process that is no rank
is left as it was; a collective the script binds to its own name at import is still timed. The verdicts these
workloads get (a slow loader, a straggler slowed in its forward, after its step or in its loader) are
tests/timing/test_watched_matrix.py's."""

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
from trainstack.problems import COMM_BOUND, INPUT_BOUND
from trainstack.record import read_launches
from trainstack.rundir import RUN_DIR_ENV, RunDir
from trainstack.telemetry import collectives

pytestmark = pytest.mark.slow

DRIVER = str(REPO / "tests" / "drivers" / "plain_ddp.py")
QUIET = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}


def watched(
    run_dir: Path, mode: str, *flags: str, steps: int = 60, env: dict | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    """The driver in `mode` under `trainstack watch`: its summary.json and the finished watch."""
    done = run_watched(run_dir, *torchrun(DRIVER, mode, str(steps)), flags=flags, env={**QUIET, **(env or {})})
    assert done.returncode == 0, explain(done)
    return json.loads(RunDir(run_dir).summary.read_text()), done


def kinds(summary: dict) -> list[str]:
    return [verdict["kind"] for verdict in summary["verdicts"]]


def test_a_healthy_plain_ddp_loop_is_recorded_per_rank_and_judged(tmp_path):
    summary, _ = watched(tmp_path / "run", "healthy")
    assert summary["judged"] is True and summary["world_size"] == 2
    # Not `== []`: beside the other test worker's ranks on the 2 cores, the scheduler can slow one rank past the
    # straggler threshold, and that rank is named, rightly. A healthy run's empty verdict is the timing tier's, on a
    # quiet machine: its phase's (tests/timing/test_watched_matrix.py), its summary's (tests/timing/test_auto_spawn.py).
    assert not set(kinds(summary)) & {INPUT_BOUND, COMM_BOUND}, summary["verdicts"]
    for rank in (0, 1):
        (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(rank))
        intervals = launch.records
        assert intervals[-1].step == 60 and sum(record.samples for record in intervals) == 60 * 8192
        assert {record.lr for record in intervals} == {1e-3}
        assert all(record.comm_seconds is not None and record.forward_seconds for record in intervals)
        assert launch.ended is not None  # the closing line, written before the process group went
        # The eval-mode forward after the loop; rank 0's torch.save and every rank's torch.distributed.checkpoint
        paused = sorted(pause.part for pause in launch.ended.paused)
        assert paused == ["checkpoint_save"] * (2 if rank == 0 else 1) + ["evaluation"], paused


def test_the_same_loop_on_fsdp2_is_recorded_with_its_collectives(tmp_path):
    summary, _ = watched(tmp_path / "run", "fsdp", steps=30)
    assert summary["judged"] is True and summary["world_size"] == 2
    for rank in (0, 1):
        (launch,) = read_launches(RunDir(tmp_path / "run").rank_records(rank))
        assert launch.records[-1].step == 30 and sum(record.samples for record in launch.records) == 30 * 8192
        # FSDP's all-gathers and reduce-scatters, timed on the root fully_shard took last
        assert all(record.comm_buckets and record.forward_seconds for record in launch.records)


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


@pytest.mark.parametrize("framework", ["lightning.pytorch", "pytorch_lightning", "transformers"])
def test_a_framework_trainer_gets_trainstacks_callback_by_itself(tmp_path, framework):
    """Lightning's Trainer (from `lightning.pytorch` or the standalone `pytorch_lightning`) launched by Lightning
    itself (`python script.py`, devices=2), transformers' by torchrun: no trainstack line in either, each rank
    recorded once, by the callback watch added."""
    pytest.importorskip(framework)
    steps = 20
    if framework != "transformers":
        command = [sys.executable, str(REPO / "tests" / "drivers" / "lightning_plain.py"), str(steps), framework]
    else:
        command = torchrun(str(REPO / "tests" / "drivers" / "hf_plain.py"), str(tmp_path / "out"), str(steps))
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
