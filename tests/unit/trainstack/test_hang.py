"""Issue 31: a hang names where each rank waits. Without a process: the verdict's logic on evidence folders as the
ranks write them, the threshold, the environment. With processes (2 CPU ranks over gloo, a user's loop under
`trainstack watch` instrumented with trainstack.monitor; tests/drivers/hang_loop.py): a skipped collective, a stuck
DataLoader, py-spy that cannot attach (and a healthy run, with a straggler: test_user_loop.py)."""

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
from trainstack import thresholds
from trainstack.hang import FR_BUFFER_ENV, FR_DUMP_ENV, FR_SWITCH_ENV, PYSPY_ENV, hang_environment
from trainstack.hang_verdict import (
    analyze,
    latest_stall,
    read_verdict,
    stack_from_faulthandler,
    stack_from_pyspy,
    where,
)
from trainstack.rundir import METRICS_DIR_ENV, RunDir, free_port, hang_pid_file
from trainstack.train.launcher.hang import hang_seconds

DRIVER = REPO / "tests" / "drivers" / "hang_loop.py"
SITE = "/venv/lib/python3.11/site-packages"
C10D = {"file": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 3252, "function": "all_reduce"}


def entry(seq: int, op: str = "all_reduce", sizes=((4,),)) -> dict:
    return {
        "pg_id": 0,
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "input_sizes": sizes,
        "state": "scheduled",
    }


def write_rank(stall: Path, rank: int, stack: list[dict], entries: list[dict]) -> None:
    stall.mkdir(parents=True, exist_ok=True)
    (stall / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "stack": stack, "flight_recorder": entries}))


def user(line: int, function: str = "main") -> dict:
    return {"file": "/home/me/train.py", "line": line, "function": function}


# ---- the verdict, from evidence folders --------------------------------------------------------------------------
def test_a_rank_that_never_joined_is_named_with_the_collective_and_its_place(tmp_path):
    write_rank(tmp_path, 0, [user(40), C10D], [entry(s) for s in range(1, 27)])
    write_rank(
        tmp_path,
        1,
        [
            user(40),
            {"file": f"{SITE}/torch/utils/data/dataloader.py", "line": 733, "function": "__next__"},
            user(12, "__getitem__"),
        ],
        [entry(s) for s in range(1, 26)],
    )
    hang = analyze(tmp_path)
    assert hang.headline.startswith("rank 1 has not joined all_reduce #26 of process group 0 (rank 0 waits in it)")
    assert "train.py:12 in `__getitem__`, in `__next__` (torch/utils/data/dataloader.py:733)" in hang.headline
    assert hang.culprits == [1] and "DataLoader" in hang.fix


def test_a_rank_that_called_no_collective_yet_is_behind_not_unknown(tmp_path):
    # A hang before the first step: rank 1's recorder is on and empty; it never reached the first collective.
    write_rank(tmp_path, 0, [user(40), C10D], [entry(1)])
    write_rank(tmp_path, 1, [user(30, "load_shard")], [])
    hang = analyze(tmp_path)
    assert hang.headline == (
        "rank 1 has not joined all_reduce #1 of process group 0 (rank 0 waits in it); "
        "rank 1 is at train.py:30 in `load_shard`"
    ), hang
    assert hang.culprits == [1]
    # Its recorder off: then nothing says it called no collective, and the verdict says so.
    answer = tmp_path / "rank-1.json"
    answer.write_text(json.dumps({**json.loads(answer.read_text()), "flight_recorder_error": "the recorder is off"}))
    assert "rank 1 gave no Flight Recorder entries" in analyze(tmp_path).headline


def test_groups_are_told_apart_by_name_across_recorders(tmp_path):
    # NCCL's default group and a gloo side group (a CPU barrier, say) both numbered 0, each by its own recorder:
    # rank 0's barrier #1 of the side group is no mismatch with all_reduce #1 of the default group.
    def named(seq: int, group: str, op: str = "all_reduce") -> dict:
        return {**entry(seq, op), "process_group": [group, "default_pg" if group == "0" else "undefined"]}

    write_rank(tmp_path, 0, [user(50), C10D], [named(1, "0"), named(2, "0"), named(1, "1", "barrier")])
    write_rank(tmp_path, 1, [user(12, "__getitem__")], [named(1, "0")])
    hang = analyze(tmp_path)
    assert hang.headline.startswith("rank 1 has not joined all_reduce #2 of process group 0 (rank 0 waits in it)")
    assert hang.culprits == [1]


def test_different_collectives_at_one_sequence_number_are_a_mismatch(tmp_path):
    write_rank(tmp_path, 0, [user(50), C10D], [entry(1), entry(2, "broadcast", [[8]])])
    write_rank(tmp_path, 1, [user(40), C10D], [entry(1), entry(2)])
    hang = analyze(tmp_path)
    assert hang.headline.startswith(
        "mismatched collectives at #2 of process group 0: rank 0 broadcast of sizes [[8]] at train.py:50"
    )
    assert "if rank == 0:" in hang.fix


def test_a_rank_whose_process_is_gone_is_named_as_died(tmp_path):
    write_rank(tmp_path, 0, [user(40), C10D], [entry(1), entry(2)])
    (tmp_path / "collection.json").write_text(
        json.dumps({"ranks": {"0": {"alive": True, "steps": 9}, "1": {"alive": False, "steps": 9}}})
    )
    assert analyze(tmp_path).headline == "rank 1 died; the other ranks wait for it"


def test_ranks_stuck_outside_any_collective_are_named_where_they_are(tmp_path):
    write_rank(
        tmp_path, 0, [user(70), {"file": f"{SITE}/torch/serialization.py", "line": 900, "function": "save"}], [entry(1)]
    )
    write_rank(tmp_path, 1, [user(40), C10D], [entry(1)])
    hang = analyze(tmp_path)
    assert hang.headline == (
        "no rank is behind the others' collectives; rank 0 is at train.py:70 in `main`, in "
        "`save` (torch/serialization.py:900) while rank 1 wait in a collective"
    )
    assert "checkpoint" in hang.fix


@pytest.mark.parametrize(
    "frame",
    [
        {"file": f"{SITE}/datasets/load.py", "line": 2000, "function": "load_dataset"},
        {"file": f"{SITE}/huggingface_hub/file_download.py", "line": 900, "function": "hf_hub_download"},
        # from_pretrained downloading, then reading, its weights: a load, not a checkpoint write
        [
            {"file": f"{SITE}/transformers/modeling_utils.py", "line": 4300, "function": "from_pretrained"},
            {
                "file": f"{SITE}/transformers/modeling_utils.py",
                "line": 1200,
                "function": "_get_resolved_checkpoint_files",
            },
            {"file": f"{SITE}/huggingface_hub/file_download.py", "line": 900, "function": "hf_hub_download"},
        ],
        [
            {"file": f"{SITE}/transformers/modeling_utils.py", "line": 4300, "function": "from_pretrained"},
            {"file": f"{SITE}/transformers/modeling_utils.py", "line": 800, "function": "load_state_dict"},
            {"file": f"{SITE}/safetensors/torch.py", "line": 300, "function": "load_file"},
        ],
        # a resume reading its checkpoint from slow storage
        [
            {"file": f"{SITE}/accelerate/accelerator.py", "line": 3500, "function": "load_state"},
            {"file": f"{SITE}/accelerate/checkpointing.py", "line": 200, "function": "load_accelerator_state"},
            {"file": f"{SITE}/torch/serialization.py", "line": 1400, "function": "load"},
        ],
    ],
)
def test_a_rank_still_fetching_its_data_or_model_holds_up_the_barrier_the_others_wait_at(tmp_path, frame):
    # Accelerate's main_process_first: rank 0 fills the cache while rank 1 waits at the barrier after it.
    frames = frame if isinstance(frame, list) else [frame]
    write_rank(tmp_path, 0, [user(12, "build"), *frames], [entry(1, "broadcast")])
    write_rank(tmp_path, 1, [user(12, "build"), C10D], [entry(1, "broadcast"), entry(2, "barrier")])
    hang = analyze(tmp_path)
    assert hang.culprits == [0] and hang.headline.startswith("rank 0 has not joined barrier #2"), hang
    assert "preparing its data or model" in hang.fix


def test_stacks_are_read_from_faulthandler_and_py_spy_output():
    faulthandler = (
        'Thread 0x00007f (most recent call first):\n  File "/x/threading.py", line 3 in wait\n\n'
        "Current thread 0x00007e (most recent call first):\n"
        f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/home/me/train.py", line 40 in main\n'
    )
    assert [str(f) for f in stack_from_faulthandler(faulthandler)] == [
        "train.py:40 in `main`",
        "distributed_c10d.py:3252 in `all_reduce`",
    ]
    pyspy = (
        'Process 12: python train.py\nPython v3.11.2\n\nThread 12 (idle): "MainThread"\n'
        f"    Batches.__getitem__ (/home/me/train.py:12)\n"
        f"    _BaseDataLoaderIter.__next__ ({SITE}/torch/utils/data/dataloader.py:733)\n"
        "    main (/home/me/train.py:40)\n"
    )
    stack = stack_from_pyspy(pyspy)
    assert [str(f) for f in stack] == [
        "train.py:40 in `main`",
        "dataloader.py:733 in `_BaseDataLoaderIter.__next__`",
        "train.py:12 in `Batches.__getitem__`",
    ]
    assert where(stack) == (
        "at train.py:12 in `Batches.__getitem__`, in `_BaseDataLoaderIter.__next__` "
        "(torch/utils/data/dataloader.py:733)"
    )


def test_the_latest_stall_is_read_and_an_unanalyzed_one_analyzed(tmp_path):
    hang_dir = RunDir(tmp_path).hang
    assert read_verdict(hang_dir) is None
    for n in (1, 2, 10):
        write_rank(hang_dir / f"stall-{n}", 0, [user(n)], [])
    assert latest_stall(hang_dir).name == "stall-10"
    assert "train.py:10" in read_verdict(hang_dir).headline


# ---- the threshold and the environment --------------------------------------------------------------------------
def test_the_threshold_follows_the_steps_within_its_floor_and_ceiling(monkeypatch):
    monkeypatch.delenv("TRAINSTACK_HANG_SECONDS", raising=False)
    assert hang_seconds([]) == thresholds.HANG_FLOOR.value
    assert hang_seconds([5.0, 6.0, 100.0]) == 6.0 * thresholds.HANG_STEP_MULTIPLE.value
    assert hang_seconds([1000.0]) == thresholds.HANG_CEILING.value
    # The first step: no step time to go by, so the ceiling, within half the collective timeout
    assert hang_seconds([], first_step=True) == thresholds.HANG_CEILING.value
    assert hang_seconds([], before=100.0, first_step=True) == 50.0
    monkeypatch.setenv("TRAINSTACK_HANG_SECONDS", "3")
    assert hang_seconds([1000.0]) == 3.0
    assert hang_seconds([], first_step=True) == 3.0
    # A rank still starting (loading data, building): half the timeout its peers wait under, whatever the steps
    # say; a timeout raised for a long start-up gives it that room; without one, the ceiling
    assert hang_seconds([], before=100.0, first_step=True, starting=True) == 50.0
    assert hang_seconds([], before=7200.0, first_step=True, starting=True) == 3600.0
    assert hang_seconds([], first_step=True, starting=True) == thresholds.HANG_CEILING.value


def test_the_flight_recorder_is_on_unless_the_user_says_otherwise(tmp_path):
    added = hang_environment(tmp_path, "run-1", {})
    assert added == {FR_BUFFER_ENV: "2000", FR_DUMP_ENV: str(RunDir(tmp_path).hang.resolve() / "run-1" / "fr-rank-")}
    assert hang_environment(tmp_path, "r", {FR_BUFFER_ENV: "50", FR_DUMP_ENV: "/mine/fr-"}) == {}
    assert hang_environment(tmp_path, "r", {FR_SWITCH_ENV: "0"}) == {}
    assert set(hang_environment(tmp_path, "r", {FR_BUFFER_ENV: "50"})) == {FR_DUMP_ENV}  # the user's size, our place
    assert (RunDir(tmp_path).hang / "run-1").is_dir()


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


@pytest.mark.slow
def test_a_collective_skipped_before_the_first_step_is_named_too(tmp_path):
    # No step yet: the wait counts from the ranks' start of their loops (train/launcher/hang.py).
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


def test_a_recorder_that_fails_to_dump_is_said_so_and_its_rank_is_not_taken_for_one_with_no_collective(
    tmp_path, monkeypatch
):
    from trainstack.hang import flight_recorder

    c10d = torch._C._distributed_c10d

    def cuda_error(**options):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(c10d, "_dump_fr_trace_json", lambda **options: json.dumps({"entries": []}), raising=False)
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", cuda_error, raising=False)
    entries, note = flight_recorder()
    assert (
        entries == [] and note == "NCCL's recorder: RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    # Its peer waits in all_reduce #3; the rank whose NCCL recorder failed is not "behind, having called none"
    write_rank(tmp_path, 0, [user(40), C10D], [entry(1), entry(2), entry(3)])
    (tmp_path / "rank-1.json").write_text(
        json.dumps({"rank": 1, "stack": [user(40), C10D], "flight_recorder": entries, "flight_recorder_error": note})
    )
    hang = analyze(tmp_path)
    assert "rank 1: no Flight Recorder entries (NCCL's recorder: RuntimeError" in " ".join(hang.evidence), hang
    assert not hang.headline.startswith("rank 1 has not joined"), hang.headline
    # gloo's recorder answered, NCCL's did not: what it holds is shown, and that NCCL's part is missing
    (tmp_path / "rank-1.json").write_text(
        json.dumps({"rank": 1, "stack": [user(40), C10D], "flight_recorder": [entry(1)], "flight_recorder_error": note})
    )
    (line,) = [line for line in analyze(tmp_path).evidence if line.startswith("rank 1:")]
    assert "last collective all_reduce #1 of group 0 (Flight Recorder incomplete: NCCL's recorder" in line, line


# ---- diagnose --run-dir -----------------------------------------------------------------------------------------
def test_diagnose_names_where_ranks_wait_once_evidence_of_this_stall_is_there(tmp_path):
    from trainstack.hang_verdict import latest_hang
    from trainstack.monitoring.diagnose.snapshot import RankView, Snapshot
    from trainstack.monitoring.diagnose.thresholds import Thresholds
    from trainstack.monitoring.diagnose.verdicts import diagnose

    stall = RunDir(tmp_path).hang / "stall-1"
    write_rank(stall, 0, [user(40), C10D], [entry(1), entry(2)])
    write_rank(stall, 1, [user(12, "load")], [entry(1)])
    hang = latest_hang(tmp_path)
    collected = hang[1]
    ranks = [
        RankView(
            rank=r,
            steps=60,
            steps_per_second=0.0,
            samples_per_second=0.0,
            data_wait_ratio=0.0,
            step_seconds=None,
            forward_seconds=None,
            last_step_time=collected - 70,
        )
        for r in "01"
    ]
    verdicts = diagnose(Snapshot("test", collected + 5, ranks, hang=hang), Thresholds())
    assert [v.kind for v in verdicts] == ["stalled"]
    assert verdicts[0].summary == (
        "no rank has completed a step for 75 s: rank 1 has not joined all_reduce #2 of "
        "process group 0 (rank 0 waits in it); rank 1 is at train.py:12 in `load`"
    )
    stepped_since = [RankView(**{**vars(r), "last_step_time": collected + 1}) for r in ranks]
    assert diagnose(Snapshot("test", collected + 5, stepped_since, hang=hang), Thresholds()) == []


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


# ---- the doctor -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, status",
    [
        ({}, "PASS"),
        ({"TRAINSTACK_FLIGHT_RECORDER": "0"}, "WARN"),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, "WARN"),
        ({"TORCH_FR_BUFFER_SIZE": "500"}, "PASS"),
    ],
)
def test_the_doctor_says_whether_a_hang_will_name_its_collective(env, status):
    from trainstack.train.launcher.doctor.config import DoctorConfig
    from trainstack.train.launcher.doctor.hang_checks import check_hang_evidence

    result = check_hang_evidence(DoctorConfig(env={"PATH": "/nonexistent", **env}), None)
    assert result.status == status, result
    assert ("py-spy not installed" in result.detail) and ("docs/benchmarks.md" in (result.fix or result.detail))


# ---- faulthandler: a rank that cannot answer ---------------------------------------------------------------------
@pytest.mark.slow
def test_faulthandler_gives_the_stack_of_a_rank_that_does_not_answer(tmp_path):
    import subprocess

    from trainstack.train.launcher.hang import HangWatch

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


# ---- the report -------------------------------------------------------------------------------------------------
def test_the_report_shows_each_stall_with_its_verdict(tmp_path):
    from trainstack.monitoring.report.hangs import hang_section

    assert hang_section(tmp_path) == []
    write_rank(RunDir(tmp_path).hang / "stall-1", 0, [user(40), C10D], [entry(1), entry(2)])
    write_rank(RunDir(tmp_path).hang / "stall-1", 1, [user(12, "load")], [entry(1)])
    parts = hang_section(tmp_path)
    assert parts[0] == "<h2>Hangs</h2>" and "<h3>stall-1</h3><p>rank 1 has not joined all_reduce #2" in parts[1]


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


def test_a_job_s_own_sigusr2_handler_is_left_alone_and_its_loop_takes_the_responder_over(tmp_path, monkeypatch):
    import signal
    import threading

    import trainstack.hang as hang

    monkeypatch.setattr(hang, "_faulthandler_registered", None)
    monkeypatch.setattr(hang, "_respond", lambda *args: None)  # no thread left polling after the test
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGUSR2, mine)
    try:
        assert threading.current_thread() is threading.main_thread()
        assert hang.start_responder(4, str(tmp_path), starting=True)
        assert signal.getsignal(signal.SIGUSR2) is mine
    finally:
        signal.signal(signal.SIGUSR2, previous)
    announced = json.loads(hang_pid_file(tmp_path, 4).read_text())
    assert (announced["faulthandler"], announced["starting"]) == (False, True)
    # Its loop's monitor calls it again: no second responder, and the rank is in its loop now
    assert not hang.start_responder(4, str(tmp_path))
    announced = json.loads(hang_pid_file(tmp_path, 4).read_text())
    assert (announced["faulthandler"], announced["starting"]) == (False, False)
    assert [p.name for p in tmp_path.iterdir()] == ["hang-rank-4.json"]


def test_evidence_is_collected_once_per_stall_and_again_after_a_step(tmp_path, monkeypatch):
    import trainstack.train.launcher.hang as supervisor

    clock, steps, collected = [1000.0], {"0": 5.0, "1": 5.0}, []
    monkeypatch.setattr(supervisor.time, "time", lambda: clock[0])
    monkeypatch.setattr(supervisor, "steps_by_rank", lambda metrics_dir: dict(steps))
    monkeypatch.setenv("TRAINSTACK_HANG_SECONDS", "10")
    watch = supervisor.HangWatch(RunDir(tmp_path), tmp_path, print)
    monkeypatch.setattr(watch, "collect", lambda *args: collected.append(clock[0]))

    def advance(seconds: float) -> None:
        for _ in range(int(seconds)):
            clock[0] += 1
            watch.poll()
            if watch.thread:
                watch.thread.join()

    advance(9)
    assert collected == []  # under the threshold
    advance(30)
    assert collected == [1011.0]  # once, however long the stall lasts (it began at the first look, 1001)
    steps["1"] = 6.0
    advance(5)
    assert collected == [1011.0]  # a step ended the stall
    advance(20)
    assert collected == [1011.0, 1050.0]  # the next stall collects again


def test_before_the_first_step_the_wait_counts_from_the_latest_rank_in_its_loop(tmp_path, monkeypatch):
    import trainstack.train.launcher.hang as supervisor

    clock, steps, ranks, collected = [1000.0], {}, {}, []
    monkeypatch.setattr(supervisor.time, "time", lambda: clock[0])
    monkeypatch.setattr(supervisor, "steps_by_rank", lambda metrics_dir: dict(steps))
    monkeypatch.delenv("TRAINSTACK_HANG_SECONDS", raising=False)
    watch = supervisor.HangWatch(RunDir(tmp_path), tmp_path, print, before=100.0)  # the ceiling: 50 s here
    monkeypatch.setattr(watch, "registrations", lambda: supervisor.Registrations(dict(ranks)))
    monkeypatch.setattr(watch, "collect", lambda steps, quiet: collected.append((clock[0], steps)))

    def advance(seconds: float) -> None:
        for _ in range(int(seconds)):
            clock[0] += 1
            watch.poll()

    advance(120)
    assert collected == []  # no rank in its loop yet: start-up (imports, rendezvous, loading) is no stall
    ranks["0"] = 4242
    advance(30)
    ranks["1"] = 4243  # the latest rank's arrival (seen at the next look, 1151) starts the wait again
    advance(50)
    assert collected == []
    advance(1)
    assert collected == [(1201.0, {"0": 0.0, "1": 0.0})]
    steps.update({"0": 1.0, "1": 1.0})
    advance(1)
    assert watch.step_seconds == []  # the first step's wait is not a step time the next threshold goes by


def test_ranks_still_starting_wait_half_the_timeout_and_reaching_the_loop_is_progress(tmp_path, monkeypatch):
    import trainstack.train.launcher.hang as supervisor

    clock, starting, collected = [1000.0], {"0", "1"}, []
    monkeypatch.setattr(supervisor.time, "time", lambda: clock[0])
    monkeypatch.setattr(supervisor, "steps_by_rank", lambda metrics_dir: {})
    monkeypatch.setenv("TRAINSTACK_HANG_SECONDS", "3")  # a threshold for steps: start-up goes by the timeout
    watch = supervisor.HangWatch(RunDir(tmp_path), tmp_path, print, before=100.0)

    monkeypatch.setattr(
        watch, "registrations", lambda: supervisor.Registrations({"0": 4242, "1": 4243}, starting=frozenset(starting))
    )
    monkeypatch.setattr(watch, "collect", lambda steps, quiet: collected.append(clock[0]))

    def advance(seconds: int) -> None:
        for _ in range(seconds):
            clock[0] += 1
            watch.poll()

    advance(50)  # both registered at the first look (1001)
    assert collected == []
    advance(1)
    assert collected == [1051.0]
    starting.discard("0")  # rank 0 reached its loop: that stall is over, and the wait starts again
    advance(50)
    assert collected == [1051.0]
    advance(1)
    assert collected == [1051.0, 1102.0]
    starting.clear()  # both in their loops: the first step's threshold (TRAINSTACK_HANG_SECONDS here)
    advance(4)
    assert collected == [1051.0, 1102.0, 1106.0]


def test_a_stall_after_the_ranks_left_start_up_within_one_look_is_collected_once(tmp_path, monkeypatch):
    import trainstack.train.launcher.hang as supervisor

    metrics, clock, steps = tmp_path / "metrics", [1000.0], {}
    metrics.mkdir()
    monkeypatch.setattr(supervisor.time, "time", lambda: clock[0])
    monkeypatch.setattr(supervisor, "steps_by_rank", lambda metrics_dir: dict(steps))
    monkeypatch.setenv("TRAINSTACK_HANG_SECONDS", "10")
    monkeypatch.setenv(PYSPY_ENV, "0")
    run_dir = RunDir(tmp_path / "run")
    watch = supervisor.HangWatch(run_dir, metrics, lambda line: None)

    def register(starting: bool) -> None:
        for rank in (0, 1):  # pids no process has: nothing is signalled, the ranks count as gone
            record = {"rank": rank, "pid": 2**22 + 7 + rank, "faulthandler": False, "starting": starting}
            hang_pid_file(metrics, rank).write_text(json.dumps(record))

    def advance(seconds: int) -> None:
        for _ in range(seconds):
            clock[0] += 1
            watch.poll()
            if watch.thread:
                watch.thread.join()

    register(starting=True)
    advance(5)
    register(starting=False)  # both reach their loops and make their first step before the next look
    steps.update({"0": 1.0, "1": 1.0})
    advance(1)
    steps.update({"0": 2.0, "1": 2.0})
    advance(60)  # then no step: one stall, however long
    assert sorted(p.name for p in run_dir.hang.iterdir()) == ["stall-1"]


def test_diagnose_run_dir_flag_reads_the_evidence(tmp_path, monkeypatch, capsys):
    import argparse

    from trainstack.monitoring.diagnose import cli, snapshot, sources

    stall = RunDir(tmp_path).hang / "stall-1"
    write_rank(stall, 0, [user(40), C10D], [entry(1), entry(2)])
    write_rank(stall, 1, [user(12, "load")], [entry(1)])
    collected = stall.stat().st_mtime
    ranks = [
        snapshot.RankView(
            rank=r,
            steps=60,
            steps_per_second=0.0,
            samples_per_second=0.0,
            data_wait_ratio=0.0,
            step_seconds=None,
            forward_seconds=None,
            last_step_time=collected - 70,
        )
        for r in "01"
    ]
    monkeypatch.setattr(sources, "open_source", lambda *args: argparse.Namespace(ended_meanwhile=""))
    monkeypatch.setattr(snapshot, "read_snapshot", lambda source: snapshot.Snapshot("test", collected + 5, ranks))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--run-dir", str(tmp_path)])) == cli.EXIT_PROBLEM
    assert "rank 1 has not joined all_reduce #2 of process group 0" in capsys.readouterr().out
