"""trainstack doctor: every check's PASS, WARN and FAIL paths on real inputs (tmpfs mounts for /dev/shm and
the output directory, a real listening socket for ports, real rlimits); GPU facts come as GpuInventory."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import explain, run_trainstack
from trainstack.rundir import free_port
from trainstack.train.launcher.doctor import (
    CheckResult,
    DoctorConfig,
    GpuInventory,
    Status,
    render_json,
    render_table,
    run_checks,
)
from trainstack.train.launcher.doctor.config import MiB, usable_cpu_count
from trainstack.train.launcher.doctor.gpu_checks import (
    check_cuda_version,
    check_gpu_visibility,
    check_ranks_per_gpu,
    devices_cuda_exposes,
)
from trainstack.train.launcher.doctor.host_checks import check_cpus, check_memlock, check_shared_memory
from trainstack.train.launcher.doctor.inventory import probe_gpus
from trainstack.train.launcher.doctor.port_checks import check_exporter_port, check_rendezvous_port
from trainstack.train.launcher.doctor.storage_checks import check_output_dir
from trainstack.train.launcher.doctor.switch_checks import check_debug_switches
from trainstack.units import human_bytes

CPU_HOST = GpuInventory(driver_found=False, torch_version="2.13.0+cpu")
UUIDS = ("GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2", "GPU-dddd-3")


def gpu_host(visible: int = 4, **changes) -> GpuInventory:
    facts = dict(
        driver_found=True,
        uuids=UUIDS,
        names=("NVIDIA H100 80GB HBM3",) * 4,
        driver_version="570.86",
        driver_cuda_version="12.8",
        torch_version="2.13.0+cu128",
        torch_cuda_version="12.8",
        torch_device_count=visible,
    )
    return GpuInventory(**{**facts, **changes})


def config(**changes) -> DoctorConfig:
    """Inputs that do not depend on this machine unless a test says so."""
    fixed = dict(env={}, cpu_count=64, memlock_bytes=None, gpus=CPU_HOST, exporter_port=0)
    return DoctorConfig(**{**fixed, **changes})


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


# --- results ------------------------------------------------------------------------------------------------


def test_a_problem_without_a_fix_is_refused():
    with pytest.raises(ValueError, match="without a fix"):
        CheckResult("x", Status.WARN, "something is off")


def test_table_shows_fixes_under_problems_and_json_says_not_ok():
    results = [
        CheckResult("shm", Status.FAIL, "too small", "bigger"),
        CheckResult("cpus", Status.PASS, "fine"),
    ]
    table = render_table(results)
    assert "FAIL    shm   too small" in table and "fix: bigger" in table
    assert table.splitlines()[-1] == "doctor: 1 PASS, 0 WARN, 1 FAIL"
    document = json.loads(render_json(results))
    assert document["ok"] is False
    assert document["checks"][0] == {"name": "shm", "status": "FAIL", "detail": "too small", "fix": "bigger"}


def test_bad_inputs_are_config_errors():
    from trainstack.errors import ConfigError

    with pytest.raises(ConfigError, match="--node-rank 2 must be below --nnodes 2"):
        config(nnodes=2, node_rank=2)
    with pytest.raises(ConfigError, match="--nproc-per-node"):
        config(nproc_per_node=0)


# --- GPUs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "env", "status", "phrase"),
    [
        (CPU_HOST, {}, Status.WARN, "no NVIDIA driver: CPU ranks"),
        (CPU_HOST, {"NVIDIA_VISIBLE_DEVICES": "all"}, Status.WARN, "started without the NVIDIA runtime"),
        (dataclasses.replace(CPU_HOST, torch_device_count=2), {}, Status.WARN, "NVML is missing"),
        (
            GpuInventory(driver_found=True, nvml_error="Driver/library version mismatch"),
            {},
            Status.FAIL,
            "NVML failed",
        ),
        (gpu_host(0, torch_cuda_version="", torch_version="2.13.0+cpu"), {}, Status.FAIL, "is a CPU build"),
        (gpu_host(0), {"CUDA_VISIBLE_DEVICES": ""}, Status.FAIL, "hides all of them"),
        (gpu_host(0), {"CUDA_VISIBLE_DEVICES": "-1"}, Status.FAIL, "hides all of them"),
        (gpu_host(0), {}, Status.FAIL, "but torch sees 0"),
        (gpu_host(2), {"CUDA_VISIBLE_DEVICES": "0,1"}, Status.WARN, "hides 2: they sit idle"),
        (gpu_host(4), {"NVIDIA_VISIBLE_DEVICES": "0,1"}, Status.WARN, "only acts when the NVIDIA container"),
        (gpu_host(4), {"NVIDIA_VISIBLE_DEVICES": "all"}, Status.PASS, "NVML sees 4 GPU(s) (4 x NVIDIA H100"),
        (gpu_host(2), {"CUDA_VISIBLE_DEVICES": "GPU-cccc,GPU-aaaa"}, Status.WARN, "hides 2: they sit idle"),
    ],
)
def test_gpu_visibility(gpus, env, status, phrase):
    result = check_gpu_visibility(config(env=env), gpus)
    assert result.status is status, result
    assert phrase in result.detail


def test_cuda_stops_reading_visible_devices_at_the_first_bad_entry():
    assert devices_cuda_exposes("0,1,7,2", UUIDS) == UUIDS[:2]
    assert devices_cuda_exposes("3,3", UUIDS) == UUIDS[3:]
    assert devices_cuda_exposes("GPU-dddd", UUIDS) == UUIDS[3:]
    assert devices_cuda_exposes("GPU-ffff,0", UUIDS) == ()


@pytest.mark.parametrize(
    ("nproc", "gpus", "status", "phrase"),
    [
        (None, gpu_host(4), Status.PASS, "one rank per GPU: 4"),
        (8, gpu_host(4), Status.FAIL, "ranks would share a GPU"),
        (2, gpu_host(4), Status.WARN, "leaves 2 of 4 visible GPUs idle"),
        (None, CPU_HOST, Status.PASS, "2 CPU rank(s)"),
    ],
)
def test_ranks_per_gpu(nproc, gpus, status, phrase):
    result = check_ranks_per_gpu(config(nproc_per_node=nproc), gpus)
    assert result.status is status and phrase in result.detail


@pytest.mark.parametrize(
    ("driver_cuda", "status"),
    [("11.8", Status.FAIL), ("12.4", Status.WARN), ("12.8", Status.PASS), ("13.0", Status.PASS)],
)
def test_driver_cuda_against_torch_cuda(driver_cuda, status):
    result = check_cuda_version(config(), gpu_host(driver_cuda_version=driver_cuda))
    assert result.status is status
    assert f"supports CUDA {driver_cuda}" in result.detail and "built for CUDA 12.8" in result.detail


def test_cuda_version_does_not_apply_without_a_driver():
    assert check_cuda_version(config(), CPU_HOST).status is Status.PASS


def test_probe_on_this_host_matches_what_torch_reports():
    import torch

    from trainstack.train.launcher.cuda_devices import cuda_driver_loads

    gpus = probe_gpus()
    assert gpus.torch_device_count == torch.cuda.device_count()
    # Without CUDA's driver there is no GPU for torch to find, so it is not imported to be asked.
    assert gpus.torch_version == (torch.__version__ if cuda_driver_loads() else "")
    if not gpus.driver_found:
        assert gpus.uuids == () and gpus.nvml_error == ""


# --- shared memory, memlock, CPUs ---------------------------------------------------------------------------


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


def test_missing_shm_fails(tmp_path):
    result = check_shared_memory(config(shm_path=tmp_path / "absent"), CPU_HOST)
    assert result.status is Status.FAIL and "cannot be read" in result.detail


@pytest.mark.parametrize(
    ("limit", "gpus", "nnodes", "status"),
    [
        (None, gpu_host(), 1, Status.PASS),
        (64 * 1024, CPU_HOST, 1, Status.PASS),
        (64 * 1024, gpu_host(), 1, Status.WARN),
        (64 * 1024, CPU_HOST, 2, Status.WARN),
    ],
)
def test_memlock(limit, gpus, nnodes, status):
    result = check_memlock(config(memlock_bytes=limit, nnodes=nnodes), gpus)
    assert result.status is status
    if status is Status.WARN:
        assert "memlock=-1" in result.fix


@pytest.mark.slow
def test_memlock_default_is_the_real_ulimit():
    def lower_memlock():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))

    probe = "from trainstack.train.launcher.doctor import DoctorConfig; print(DoctorConfig().memlock_bytes)"
    output = subprocess.run(
        [sys.executable, "-c", probe], preexec_fn=lower_memlock, capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "65536"


@pytest.mark.parametrize(
    ("cpus", "workers", "gpus", "status", "fix"),
    [
        (2, 2, CPU_HOST, Status.WARN, "--num-workers 0"),
        (16, 2, CPU_HOST, Status.PASS, ""),
        (64, 0, gpu_host(4), Status.WARN, "--num-workers 4"),
        (64, 4, gpu_host(4), Status.PASS, ""),
    ],
)
def test_loader_workers_against_cpus(cpus, workers, gpus, status, fix):
    result = check_cpus(config(cpu_count=cpus, num_workers=workers), gpus)
    assert result.status is status and fix in result.fix


def test_cpu_count_honours_a_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cpu_count(tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpu_count(tmp_path / "cpu.max") == affinity
    assert usable_cpu_count(tmp_path / "absent") == affinity


# --- debugging switches -------------------------------------------------------------------------------------


def test_debugging_switches_left_on_warn():
    env = {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_DEBUG": "INFO",
        "NCCL_SHM_DISABLE": "0",
        "CUDA_LAUNCH_BLOCKING": "1",
    }
    result = check_debug_switches(config(env=env), CPU_HOST)
    assert result.status is Status.WARN
    assert "NCCL_P2P_DISABLE=1" in result.detail and "NCCL_DEBUG=INFO" in result.detail
    assert "NCCL_SHM_DISABLE" not in result.detail
    assert result.fix.startswith("unset NCCL_P2P_DISABLE NCCL_DEBUG CUDA_LAUNCH_BLOCKING")


def test_quiet_nccl_passes():
    env = {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert check_debug_switches(config(env=env), CPU_HOST).status is Status.PASS


# --- ports --------------------------------------------------------------------------------------------------


@pytest.fixture
def busy_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_ports_in_use_fail_and_name_a_free_one(busy_port):
    for check, flag in ((check_rendezvous_port, "--master-port"), (check_exporter_port, "--exporter-port")):
        result = check(config(master_port=busy_port, exporter_port=busy_port), CPU_HOST)
        assert result.status is Status.FAIL and "already in use" in result.detail
        assert f"by pid {os.getpid()}" in result.detail
        suggested = int(result.fix.split(flag)[1].split()[0])
        assert suggested != busy_port


def test_free_ports_pass(busy_port):
    port = free_port()
    assert check_rendezvous_port(config(master_port=port), CPU_HOST).status is Status.PASS
    assert check_exporter_port(config(exporter_port=port), CPU_HOST).status is Status.PASS
    # Only node 0 opens the rendezvous port; no exporter, nothing to open.
    assert check_rendezvous_port(config(master_port=busy_port, nnodes=2, node_rank=1), CPU_HOST).status is Status.PASS
    assert check_exporter_port(config(exporter_port=0), CPU_HOST).status is Status.PASS


# --- output directory ---------------------------------------------------------------------------------------


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


def test_checkpoint_estimate_is_the_models_real_size():
    """The estimate comes from the built-in shapes without torch; every built model must have that many
    parameters, or the two have drifted."""
    import torch

    from trainstack.train.rank.config import TrainConfig
    from trainstack.train.rank.data import load_token_data
    from trainstack.train.rank.model import BUILTIN_MODELS, build_model

    for name in BUILTIN_MODELS:
        run = TrainConfig(model=f"builtin:{name}", seq_len=96)
        vocab = load_token_data(run.dataset, "text", run.seq_len, 0.05, run.seed, run).vocab_size
        with torch.device("meta"):
            model = build_model(run, vocab)
        assert model.head.weight is model.token_embedding.weight  # counted once: tied
        parameters = sum(p.numel() for p in model.parameters())
        assert DoctorConfig.for_run(run, launch_config()).checkpoint_bytes == parameters * 4 * 3, name
    tiny = DoctorConfig.for_run(TrainConfig(model="builtin:tiny-gpt"), launch_config()).checkpoint_bytes
    assert 4 * MiB < tiny < 6 * MiB  # fp32 weights and AdamW's two moments: a real tiny-gpt checkpoint is 4.9 MB
    assert DoctorConfig.for_run(TrainConfig(model="builtin:small-gpt"), launch_config()).checkpoint_bytes > 200 * MiB


def test_the_loader_the_run_asks_for_is_what_the_shm_check_sizes():
    from trainstack.train.rank.config import TrainConfig

    run = TrainConfig(num_workers=3, prefetch_factor=4, batch_size=16, seq_len=64)
    doctor = DoctorConfig.for_run(run, launch_config())
    assert (doctor.num_workers, doctor.prefetch_factor, doctor.loader_batch_bytes) == (3, 4, 16 * 64 * 8 * 3)


def test_no_checkpoint_estimate_for_a_factory_model_says_so(tmp_path):
    from trainstack.train.rank.config import TrainConfig

    factory = DoctorConfig.for_run(TrainConfig(model="tests.factories:pausing_gpt"), launch_config())
    assert factory.checkpoint_bytes is None
    result = check_output_dir(config(output_dir=tmp_path / "run"), CPU_HOST)
    assert result.status is Status.PASS and "no checkpoint-size estimate" in result.detail


def launch_config():
    from trainstack.train.launcher.launch_config import LaunchConfig

    return LaunchConfig(
        nproc_per_node=2,
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        use_cpu=True,
        exporter_port=0,
        exporter_host="127.0.0.1",
        rendezvous_timeout=1.0,
    )


def test_output_dir_that_is_a_file_fails(tmp_path):
    (tmp_path / "file").write_text("")
    assert check_output_dir(config(output_dir=tmp_path / "file" / "run"), CPU_HOST).status is Status.FAIL


# --- all together -------------------------------------------------------------------------------------------


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


# --- the command and the launcher ---------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--strategy", "fsdp", "--fsdp-wrap", "Blok"], "--fsdp-wrap Blok: no such module class"),
        (["--strategy", "fsdp", "--sync-batchnorm"], "--sync-batchnorm works with --strategy ddp only"),
    ],
)
def test_doctor_refuses_what_the_fsdp_trainer_refuses(flags, expected, capsys):
    from trainstack.cli import main

    assert main(["doctor", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainstack doctor: error: ") and expected in lines[0], lines
