"""The doctor's Slurm checks (train/launcher/doctor/slurm_checks.py) on fixed inputs: the roll call in the run
directory with nodes as threads, the warning signal read from a batch script, the GPUs the job asked for. On the
real test cluster: tests/process/test_slurm_bad_input.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.helpers.doctor import CPU_HOST, config, gpu_host
from trainstack.rundir import ROLL_CALL_DIR, RunDir
from trainstack.train.launcher.doctor import Status, run_checks
from trainstack.train.launcher.doctor.slurm_checks import (
    SHARED_DIR_TIMEOUT_ENV,
    check_job_gpus,
    check_shared_run_dir,
    check_warning_signal,
    roll_call,
    roll_call_key,
    sbatch_signal,
    tidy_roll_calls,
)

JOB = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1"}


def side_by_side(calls) -> list:
    """Each call in a thread of its own, as each node runs its launcher: their results in order."""
    results: list = [None] * len(calls)

    def run(index: int) -> None:
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_nodes_that_share_the_folder_all_answer_the_roll_call_and_node_0_tidies_it(tmp_path):
    folder = RunDir(tmp_path / "run").roll_call("step")
    found = side_by_side([lambda n=n: roll_call(folder, n, 3, timeout=20) for n in range(3)])
    assert found == [[], [], []]
    assert not (tmp_path / "run" / ROLL_CALL_DIR).exists()  # node 0 removed it once every node had seen every other
    assert (tmp_path / "run").is_dir()


def test_a_node_with_a_folder_of_its_own_misses_the_others_and_leaves_nothing(tmp_path):
    found = side_by_side([lambda n=n: roll_call(tmp_path / f"n{n}" / "call", n, 2, timeout=0.5) for n in range(2)])
    assert found == [[1], [0]]
    assert not any((tmp_path / f"n{n}" / "call").exists() for n in range(2))


def doctor(run_dir: Path, node_rank: int, nnodes: int = 2, **env: str):
    return config(output_dir=run_dir, node_rank=node_rank, nnodes=nnodes, env={**JOB, **env})


def test_the_shared_run_dir_check_passes_on_a_shared_folder_and_fails_on_a_node_local_one(tmp_path):
    shared = side_by_side([lambda n=n: check_shared_run_dir(doctor(tmp_path / "run", n), CPU_HOST) for n in (0, 1)])
    assert [r.status for r in shared] == [Status.PASS, Status.PASS]
    assert f"all 2 nodes see {tmp_path / 'run'}" in shared[0].detail
    local = side_by_side(
        [
            lambda n=n: check_shared_run_dir(
                doctor(tmp_path / f"n{n}" / "run", n, **{SHARED_DIR_TIMEOUT_ENV: "0.3"}), CPU_HOST
            )
            for n in (0, 1)
        ]
    )
    assert [r.status for r in local] == [Status.FAIL, Status.FAIL]
    assert local[0].detail.startswith(f"node 0 (n1) saw no other node in {tmp_path / 'n0' / 'run'} within 0.3 s")
    assert "a folder every node mounts at the same path" in local[1].fix


def test_skip_doctor_starts_a_node_without_waiting_for_the_others_and_says_the_check_was_not_made(tmp_path):
    """Node 1 alone, with the default 180 s timeout: under --skip-doctor it neither waits nor leaves a marker."""
    skipped = check_shared_run_dir(
        config(output_dir=tmp_path / "run", node_rank=1, nnodes=2, env=JOB, roll_call=False), CPU_HOST
    )
    assert skipped.status is Status.WARN
    assert skipped.detail == f"not checked (--skip-doctor): whether every node sees {tmp_path / 'run'}"
    assert "without --skip-doctor" in skipped.fix
    assert not (tmp_path / "run").exists()


def test_a_launch_under_the_lease_removes_the_roll_calls_killed_nodes_left_and_keeps_its_own(tmp_path):
    run = RunDir(tmp_path / "run")
    env = {**JOB, "TRAINSTACK_RUN_ID": "segment-2"}
    for key in ("segment-1", "slurm-41.0-0", "segment-2"):  # two earlier launches' leftovers, and this one's call
        run.roll_call(key).mkdir(parents=True)
        (run.roll_call(key) / "node-1").write_text("n2 pid 7\n")
    (tmp_path / "run" / "checkpoints").mkdir()
    assert tidy_roll_calls(tmp_path / "run", env) == ["segment-1", "slurm-41.0-0"]
    assert [path.name for path in (tmp_path / "run" / ROLL_CALL_DIR).iterdir()] == ["segment-2"]
    assert (run.roll_call("segment-2") / "node-1").is_file() and (tmp_path / "run" / "checkpoints").is_dir()
    assert tidy_roll_calls(tmp_path / "elsewhere", env) == []  # no run directory yet: nothing to do


@pytest.mark.parametrize("run_id", ["..", ".", "/etc", "../../elsewhere", "team/exp1", ""])
def test_a_run_id_of_any_spelling_names_one_folder_inside_the_roll_calls_and_only_it_is_removed(tmp_path, run_id):
    run = RunDir(tmp_path / "run")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    folder = run.roll_call(run_id)
    assert folder.parent == tmp_path / "run" / ROLL_CALL_DIR and not folder.name.startswith(".")
    assert side_by_side([lambda: roll_call(folder, 0, 1, timeout=5)]) == [[]]
    assert (tmp_path / "run" / "checkpoints").is_dir()  # node 0 tidied the call's folder, nothing above it


def test_one_node_needs_no_roll_call_and_a_bad_timeout_is_refused(tmp_path):
    alone = check_shared_run_dir(doctor(tmp_path / "run", 0, nnodes=1), CPU_HOST)
    assert alone.status is Status.PASS and not (tmp_path / "run").exists()
    bad = check_shared_run_dir(doctor(tmp_path / "run", 0, **{SHARED_DIR_TIMEOUT_ENV: "soon"}), CPU_HOST)
    assert bad.status is Status.FAIL and "'soon' is not a number of seconds" in bad.detail


SCRIPT = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --signal={}\n#SBATCH --requeue\nsrun trainstack train\n"


@pytest.mark.parametrize(
    ("spec", "status", "phrase"),
    [
        ("B:TERM@120", Status.PASS, "SIGTERM to the batch shell, which must pass it on to the step 120 s before"),
        ("15@90", Status.PASS, "SIGTERM to the steps 90 s before"),
        ("SIGTERM", Status.PASS, "60 s before"),  # Slurm's default time
        ("B:USR1@90", Status.WARN, "trainstack checkpoints on SIGTERM only"),
        ("B:NOSUCH@90", Status.WARN, "is not like B:TERM@120"),
    ],
)
def test_the_warning_signal_is_read_from_the_batch_script(tmp_path, spec, status, phrase):
    result = check_warning_signal(config(env=JOB, read_batch_script=lambda job: SCRIPT.format(spec)), CPU_HOST)
    assert result.status is status and phrase in result.detail


def test_a_job_without_a_readable_warning_signal_is_warned_with_the_line_to_add():
    plain = "#!/bin/bash\n#SBATCH --nodes=2\nsrun trainstack train\n#SBATCH --signal=B:TERM@120\n"
    assert sbatch_signal(plain) is None  # sbatch stops reading #SBATCH at the first command
    for reader in (lambda job: plain, lambda job: None):
        result = check_warning_signal(config(env=JOB, read_batch_script=reader), CPU_HOST)
        assert result.status is Status.WARN and "#SBATCH --signal=B:TERM@120" in result.fix
    # sbatch's own variable wins over the script, as it does in sbatch
    result = check_warning_signal(
        config(env={**JOB, "SBATCH_SIGNAL": "B:TERM@200"}, read_batch_script=lambda job: SCRIPT.format("USR1")),
        CPU_HOST,
    )
    assert result.status is Status.PASS and "200 s before the time limit (SBATCH_SIGNAL B:TERM@200)" in result.detail


@pytest.mark.parametrize(
    ("asked", "visible", "status", "phrase"),
    [
        (None, 0, Status.PASS, "no GPUs asked on this node: CPU ranks"),
        ("4", 4, Status.PASS, "the job has 4 GPU(s) on this node and CUDA sees 4"),
        (None, 4, Status.WARN, "asked for no GPU on this node, yet CUDA sees 4"),
        ("4", 2, Status.WARN, "2 would sit idle"),
        ("2", 4, Status.WARN, "would use GPUs Slurm gave to other jobs"),
        ("two", 0, Status.FAIL, "is not a number"),
    ],
)
def test_the_gpus_the_job_asked_for_against_those_cuda_sees(asked, visible, status, phrase):
    env = {**JOB, **({"SLURM_GPUS_ON_NODE": asked} if asked is not None else {})}
    result = check_job_gpus(config(env=env), gpu_host(visible) if visible else CPU_HOST)
    assert result.status is status and phrase in result.detail


def test_the_slurm_checks_run_in_a_slurm_job_only(tmp_path):
    names = {r.name for r in run_checks(config(output_dir=tmp_path, read_batch_script=lambda job: None))}
    assert not names & {"warning-signal", "job-gpus", "shared-run-dir"}
    in_job = config(output_dir=tmp_path, env=JOB, read_batch_script=lambda job: SCRIPT.format("B:TERM@120"))
    assert [r.name for r in run_checks(in_job)][-3:] == ["warning-signal", "job-gpus", "shared-run-dir"]


def test_the_nodes_of_one_launch_meet_in_one_roll_call_whoever_started_them():
    # The run id the nodes share (the batch scripts' slurm-<job>-<segment>), even from separate sruns...
    assert roll_call_key({**JOB, "TRAINSTACK_RUN_ID": "slurm-42-1"}) == "slurm-42-1"
    # ...else the job step and segment: the batch shell's, or a step's after a requeue
    assert roll_call_key({"SLURM_JOB_ID": "42"}) == "slurm-42.batch-0"
    assert roll_call_key({**JOB, "SLURM_RESTART_COUNT": "2"}) == "slurm-42.0-2"


def test_a_node_stopped_while_it_waits_withdraws_its_marker(tmp_path, monkeypatch):
    from trainstack.train.launcher.doctor import slurm_checks

    def stopped(seconds: float) -> None:
        raise SystemExit(75)  # the launcher's SIGTERM handler before any rank starts

    monkeypatch.setattr(slurm_checks.time, "sleep", stopped)
    with pytest.raises(SystemExit):
        roll_call(RunDir(tmp_path / "run").roll_call("r"), 1, 2, timeout=20)
    assert list((tmp_path / "run").iterdir()) == []
