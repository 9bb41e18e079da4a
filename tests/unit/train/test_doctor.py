"""trainstack doctor: every check's PASS, WARN and FAIL paths on real inputs (tmpfs mounts for /dev/shm and
the output directory, a real listening socket for ports, real rlimits); GPU facts come as GpuInventory."""

from __future__ import annotations

import dataclasses
import json
import os
import socket

import pytest

from tests.helpers.doctor import CPU_HOST, UUIDS, config, gpu_host
from trainstack.rundir import free_port
from trainstack.train.launcher.doctor import (
    CheckResult,
    DoctorConfig,
    GpuInventory,
    Status,
    render_json,
    render_table,
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


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--strategy", "fsdp", "--fsdp-wrap", "Blok"], "--fsdp-wrap Blok: no such module class"),
        (["--strategy", "fsdp", "--sync-batchnorm"], "--sync-batchnorm works with --strategy ddp only"),
    ],
)
def test_doctor_refuses_what_the_fsdp_trainer_refuses(flags, expected, capsys):
    from trainstack.commands.cli import main

    assert main(["doctor", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainstack doctor: error: ") and expected in lines[0], lines


@pytest.mark.parametrize("skip", [False, True])
def test_skip_doctor_starts_on_a_fail_and_takes_no_roll_call(monkeypatch, capsys, skip):
    """`trainstack train --skip-doctor` shows a FAIL and starts anyway, and its node waits for no other node's roll
    call in the run directory (slurm_checks.check_shared_run_dir: up to 180 s)."""
    from trainstack.commands import train
    from trainstack.errors import ConfigError
    from trainstack.train.rank.config import TrainConfig

    asked = []

    def checks(doctor):
        asked.append(doctor.roll_call)
        return [CheckResult("output-dir", Status.FAIL, "no room", "free some")]

    monkeypatch.setattr(train, "run_checks", checks)
    if skip:
        train.run_doctor(TrainConfig(), launch_config(), skip=True)
    else:
        with pytest.raises(ConfigError, match="pass --skip-doctor to start anyway"):
            train.run_doctor(TrainConfig(), launch_config(), skip=False)
    assert asked == [not skip]
    assert "no room" in capsys.readouterr().err


def test_under_slurm_the_launch_removes_stale_roll_calls_before_its_preflight(monkeypatch, tmp_path):
    """Under the run directory's lease (trainstack train), not under `trainstack doctor`, which holds none."""
    from trainstack.commands import train
    from trainstack.rundir import RunDir
    from trainstack.train.rank.config import TrainConfig

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("TRAINSTACK_RUN_ID", "segment-2")
    stale = RunDir(tmp_path / "run").roll_call("segment-1")
    stale.mkdir(parents=True)
    (stale / "node-1").write_text("")
    left_at_preflight: list[list[str]] = []

    def preflight(doctor) -> list:
        left_at_preflight.append([path.name for path in (tmp_path / "run").iterdir()])
        return []

    monkeypatch.setattr(train, "run_checks", preflight)
    train.run_doctor(TrainConfig(output_dir=str(tmp_path / "run")), launch_config(), skip=False)
    assert left_at_preflight == [[]]  # the roll calls' folder too, once empty
