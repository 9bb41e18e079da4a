"""trainstack doctor on real inputs: tmpfs mounts for /dev/shm and the output directory, real rlimits, and the
command itself (the checks on given facts: tests/unit/train/test_doctor.py)."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.doctor import CPU_HOST, config, gpu_host
from tests.helpers.runs import explain, run_trainstack
from trainstack.rundir import free_port
from trainstack.train.launcher.doctor import (
    Status,
    run_checks,
)
from trainstack.train.launcher.doctor.config import MiB
from trainstack.train.launcher.doctor.host_checks import check_shared_memory
from trainstack.train.launcher.doctor.storage_checks import check_output_dir
from trainstack.units import human_bytes


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def small_shm(tmp_path):
    with tmpfs(tmp_path / "shm", "16m") as path:
        yield path


@pytest.mark.slow
def test_shm_too_small_for_the_loader_workers_fails(small_shm):
    result = check_shared_memory(config(shm_path=small_shm, num_workers=2, loader_batch_bytes=4 * MiB), CPU_HOST)
    assert result.status is Status.FAIL
    assert "is 16.0 MiB, need ~32.0 MiB for 2 rank(s) x 2 loader worker(s)" in result.detail
    assert "--shm-size=1g" in result.fix and "shm_size: 1gb" in result.fix and "medium: Memory" in result.fix


@pytest.mark.slow
def test_shm_need_grows_with_the_batches_each_worker_prefetches(small_shm):
    # tune's loader candidate doubles prefetch_factor: what fits at torch's default 2 may not at 4
    batch = 3 * MiB // 2
    assert check_shared_memory(config(shm_path=small_shm, loader_batch_bytes=batch), CPU_HOST).status is Status.PASS
    result = check_shared_memory(config(shm_path=small_shm, loader_batch_bytes=batch, prefetch_factor=4), CPU_HOST)
    assert result.status is Status.FAIL and "need ~24.0 MiB" in result.detail and "x 4 prefetched" in result.detail


@pytest.mark.slow
def test_shm_taken_by_stale_segments_warns(small_shm):
    (small_shm / "torch_12345_stale").write_bytes(b"\0" * (14 * MiB))
    result = check_shared_memory(config(shm_path=small_shm, loader_batch_bytes=MiB // 2), CPU_HOST)
    assert result.status is Status.WARN and "stale" in result.detail


@pytest.mark.slow
def test_shm_with_room_passes(small_shm):
    result = check_shared_memory(config(shm_path=small_shm, loader_batch_bytes=MiB // 2), CPU_HOST)
    assert result.status is Status.PASS and "need ~4.0 MiB" in result.detail


@pytest.mark.slow
def test_dockers_default_shm_is_too_small_for_nccl(tmp_path):
    with tmpfs(tmp_path / "shm", "64m") as shm:
        result = check_shared_memory(config(shm_path=shm), gpu_host(4))
    assert result.status is Status.FAIL
    assert "(Docker's default)" in result.detail and "+ NCCL" in result.detail


@pytest.mark.slow
def test_memlock_default_is_the_real_ulimit():
    def lower_memlock():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))

    probe = "from trainstack.train.launcher.doctor import DoctorConfig; print(DoctorConfig().memlock_bytes)"
    output = subprocess.run(
        [sys.executable, "-c", probe], preexec_fn=lower_memlock, capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "65536"


@pytest.mark.slow
def test_read_only_output_dir_fails(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", "ro") as mount:
        result = check_output_dir(config(output_dir=mount / "run"), CPU_HOST)
    assert result.status is Status.FAIL and "cannot write in" in result.detail and "Read-only" in result.detail


@pytest.mark.slow
@pytest.mark.parametrize(
    ("checkpoint_mib", "keep", "status", "phrase"),
    [
        (32, 3, Status.FAIL, "not even one checkpoint fits"),
        (6, 2, Status.WARN, "will fill the disk"),
        (1, 3, Status.PASS, "writable"),
        (32, 0, Status.PASS, "keeps no checkpoint"),  # tune's trials: however big the model, nothing to fit
    ],
)
def test_output_dir_room_for_checkpoints(tmp_path, checkpoint_mib, keep, status, phrase):
    with tmpfs(tmp_path / "disk", "16m") as disk:
        result = check_output_dir(
            config(output_dir=disk / "runs" / "a", checkpoint_bytes=checkpoint_mib * MiB, keep_checkpoints=keep),
            CPU_HOST,
        )
        assert list(disk.iterdir()) == []  # the probe file is gone, the run directory is not made
    assert result.status is status and phrase in result.detail


@pytest.mark.slow
def test_run_checks_covers_every_concern(small_shm, tmp_path):
    results = run_checks(
        config(shm_path=small_shm, output_dir=tmp_path / "run", gpus=gpu_host(4), master_port=free_port())
    )
    assert [r.name for r in results] == [
        "gpus",
        "cuda-version",
        "ranks",
        "shm",
        "memlock",
        "cpus",
        "debug-switches",
        "hang-evidence",
        "rendezvous-port",
        "exporter-port",
        "output-dir",
    ]
    assert {r.name for r in results if r.status is Status.FAIL} == {"shm"}  # 16 MiB cannot hold NCCL's buffers


@pytest.mark.slow
def test_cli_json_fails_on_a_read_only_output_dir(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", "ro") as mount:
        done = run_trainstack("doctor", "--json", "--output-dir", str(mount / "run"), "--exporter-port", "0")
    assert done.returncode == 2, explain(done)
    document = json.loads(done.stdout)
    assert document["ok"] is False
    assert {c["name"]: c["status"] for c in document["checks"]}["output-dir"] == "FAIL"


@pytest.mark.slow
def test_cli_table_takes_the_train_flags_and_environment(tmp_path):
    done = run_trainstack(
        "doctor",
        "--output-dir",
        str(tmp_path / "run"),
        "--exporter-port",
        "0",
        "--num-workers",
        "1",
        "--batch-size",
        "8",
        env={"NCCL_DEBUG": "INFO"},
    )
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "DETAIL"] and lines[-1].startswith("doctor: ")
    assert any(line.startswith("WARN    debug-switches   NCCL_DEBUG=INFO") for line in lines), done.stdout
    # the loader the flags ask for (the defaults are 2 workers and 16 samples): 2 CPU ranks x 1 worker x 2 batches
    # prefetched x 8 samples x 128 tokens (--seq-len) x 3 int64 tensors
    shm = next(line for line in lines if line.split()[1:2] == ["shm"])
    assert f"need ~{human_bytes(2 * 1 * 2 * 8 * 128 * 8 * 3)} for 2 rank(s) x 1 loader worker(s)" in shm, shm
    # a port another test holds makes a FAIL here at times: whichever it is, the exit code follows the table
    failed = any(line.startswith("FAIL") for line in lines)
    assert done.returncode == (2 if failed else 0), explain(done)


@pytest.mark.slow
def test_cli_bad_input_is_one_line():
    done = run_trainstack("doctor", "--nnodes", "2", "--node-rank", "5", "--exporter-port", "0")
    assert done.returncode == 2
    assert done.stderr.startswith("trainstack doctor: error: --node-rank") and len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_launcher_refuses_to_start_on_a_fail_unless_told(tmp_path):
    # The exporter's port is taken (FAIL); told to start anyway, the ranks train without an exporter.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = (
            "--output-dir",
            str(tmp_path / "run"),
            "--max-steps",
            "2",
            "--num-workers",
            "0",
            "--exporter-port",
            str(taken.getsockname()[1]),
            "--no-report",
        )
        refused = run_trainstack("train", *flags)
        assert refused.returncode == 2, explain(refused)
        assert "FAIL    exporter-port" in refused.stdout + refused.stderr
        assert not (tmp_path / "run").exists()  # no rank started, and the run directory is left as it was
        allowed = run_trainstack("train", *flags, "--skip-doctor")
        assert allowed.returncode == 0, explain(allowed)
