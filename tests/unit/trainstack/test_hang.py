"""Issue 31: a hang names where each rank waits. Without a process: the verdict's logic on evidence folders as the
ranks write them, the threshold, the environment. With processes (2 CPU ranks over gloo, a user's loop under
`trainstack watch` instrumented with trainstack.monitor; tests/drivers/hang_loop.py): a skipped collective, a stuck
DataLoader, py-spy that cannot attach (and a healthy run, with a straggler: test_user_loop.py)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.stalls import C10D, SITE, entry, user, write_rank
from trainstack import thresholds
from trainstack.hang import FR_BUFFER_ENV, FR_DUMP_ENV, FR_SWITCH_ENV, PYSPY_ENV, hang_environment
from trainstack.hang_verdict import (
    Frame,
    analyze,
    latest_stall,
    read_verdict,
    stack_from_faulthandler,
    stack_from_pyspy,
    where,
)
from trainstack.rundir import RunDir, hang_pid_file
from trainstack.supervisor.hang_watch import hang_seconds


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


@pytest.mark.parametrize("trainstack_at", ["/home/me/src/trainstack", "/venv/lib/python3.11/site-packages/trainstack"])
def test_trainstack_s_wrapper_of_a_collective_is_no_place_of_the_user_s(trainstack_at):
    # The loop's own all_reduce of a metric runs through the monitor's timing wrapper, from a checkout too.
    wrapper = Frame(f"{trainstack_at}/telemetry/collectives.py", 151, "collective")
    stack = [Frame("/home/me/train.py", 40, "main"), wrapper, Frame(C10D["file"], C10D["line"], C10D["function"])]
    assert where(stack).startswith("at train.py:40 in `main`, in `all_reduce` (torch/distributed/")


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


def test_ranks_all_computing_a_step_longer_than_the_threshold_are_not_called_a_deadlock(tmp_path):
    # A model too large for a CPU: the first step's backward runs past the threshold on every rank
    backward = {"file": f"{SITE}/torch/autograd/graph.py", "line": 829, "function": "_engine_run_backward"}
    for rank in (0, 1):
        write_rank(tmp_path, rank, [user(44), backward], [entry(1)])
    hang = analyze(tmp_path)
    assert hang.headline.startswith("no rank waits: every rank is computing its step; rank 0 is at train.py:44")
    assert "shrink them, or raise the threshold (TRAINSTACK_HANG_SECONDS)" in hang.fix and not hang.culprits
    assert "deadlock" not in hang.fix
    # One of them waiting in a collective meanwhile: not that case
    write_rank(tmp_path, 1, [user(40), C10D], [entry(1)])
    assert analyze(tmp_path).headline.startswith("no rank is behind the others' collectives; rank 0 is at train.py:44")


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
    from trainstack.monitoring.diagnose.verdicts import diagnose
    from trainstack.thresholds import Thresholds

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


# ---- the report -------------------------------------------------------------------------------------------------
def test_the_report_shows_each_stall_with_its_verdict(tmp_path):
    from trainstack.monitoring.report.hangs import hang_section

    assert hang_section(tmp_path) == []
    write_rank(RunDir(tmp_path).hang / "stall-1", 0, [user(40), C10D], [entry(1), entry(2)])
    write_rank(RunDir(tmp_path).hang / "stall-1", 1, [user(12, "load")], [entry(1)])
    parts = hang_section(tmp_path)
    assert parts[0] == "<h2>Hangs</h2>" and "<h3>stall-1</h3><p>rank 1 has not joined all_reduce #2" in parts[1]


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
    import trainstack.supervisor.hang_watch as supervisor

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
    import trainstack.supervisor.hang_watch as supervisor

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
    import trainstack.supervisor.hang_watch as supervisor

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
    import trainstack.supervisor.hang_watch as supervisor

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
