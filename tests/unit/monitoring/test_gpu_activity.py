"""The rank's side of GPM (trainstack/telemetry/gpu_activity.py): each log interval's record carries its own GPU's mean
SM and tensor activity, read from a pair of GPM samples, on the NVML fake; a GPU without GPM and a CPU rank carry none;
the report's per-rank table shows them where the records have them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

import trainstack.monitoring.nvml_fake as fake
from tests.helpers.fakes import FakeGpu, identity
from trainstack.monitor import Monitor
from trainstack.rundir import RunDir, read_json_lines
from trainstack.telemetry.gpu_activity import GpuActivity

H100_UUID = "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00"  # ddp_h100's GPU 0


@pytest.fixture(autouse=True)
def no_fake_host_left_behind():
    yield
    fake.load(None)


def nvml(host):
    """The NVML fake on `host`, with the by-UUID handle lookup the rank uses."""
    fake.load(host)

    def by_uuid(uuid):
        return next(
            fake.nvmlDeviceGetHandleByIndex(i)
            for i in range(fake.nvmlDeviceGetCount())
            if fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)) == uuid
        )

    return SimpleNamespace(
        **{name: getattr(fake, name) for name in dir(fake) if not name.startswith("__")},
        nvmlDeviceGetHandleByUUID=by_uuid,
    )


def test_each_read_gives_the_mean_activity_since_the_last_one():
    stand_in = nvml("ddp_h100")
    activity = GpuActivity.open(H100_UUID, stand_in)
    assert activity.read() == pytest.approx({"sm_active_ratio": 0.85, "tensor_active_ratio": 0.5})
    fake.set_gpm(0, {"NVML_GPM_METRIC_SM_UTIL": 15.0, "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 0.0})
    assert activity.read() == pytest.approx({"sm_active_ratio": 0.15, "tensor_active_ratio": 0.0})
    calls = fake.call_counts()
    assert (calls["nvmlGpmSampleGet"], calls["nvmlGpmMetricsGet"]) == (3, 2)  # the opening's, then one per read
    fake.fail("nvmlGpmSampleGet", "Unknown")
    assert activity.read() == {}  # this interval's end was not sampled
    assert activity.read() == {}  # nor, then, the next one's start
    assert activity.read() == pytest.approx({"sm_active_ratio": 0.15, "tensor_active_ratio": 0.0})
    activity.close()
    assert fake.call_counts()["nvmlGpmSampleFree"] == 2


@pytest.mark.parametrize(
    "host",
    [
        "pcie_pair",  # A100s: no GPM
        {
            "driver_version": "470.256.02",
            "missing_functions": ["nvmlGpmQueryDeviceSupport"],
            "gpus": [{"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"}],
        },
        {
            "driver_version": "550.90.07",  # MIG mode: NVML refuses whole-GPU samples
            "gpus": [
                {
                    "model": "h100_sxm5_80gb",
                    "uuid": H100_UUID,
                    "pci_bus_id": "00000000:18:00.0",
                    "overrides": {"gpm": "NVMLError_NotSupported"},
                }
            ],
        },
    ],
)
def test_no_reader_where_gpm_cannot_answer(host):
    stand_in = nvml(host)
    fake.nvmlInit()
    uuid = fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(0)) if host == "pcie_pair" else H100_UUID
    assert GpuActivity.open(uuid, stand_in) is None
    assert fake.call_counts()["nvmlGpmSampleAlloc"] == fake.call_counts()["nvmlGpmSampleFree"]


def test_gpu_ranks_records_carry_its_activity_a_cpu_ranks_none(tmp_path, plain_env, monkeypatch):
    gpu, stand_in = FakeGpu(), nvml("ddp_h100")
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: gpu.new_event())
    real_open = GpuActivity.open
    monkeypatch.setattr(GpuActivity, "open", classmethod(lambda cls, uuid: real_open(uuid, stand_in)))
    for device, run_dir in ((torch.device("cuda"), tmp_path / "gpu"), (torch.device("cpu"), tmp_path / "cpu")):
        monitor = Monitor(run_dir, identity(H100_UUID), 1.0, None, device)
        for sm in (85.0, 20.0):
            fake.set_gpm(0, {"NVML_GPM_METRIC_SM_UTIL": sm})
            monitor.data_wait_started()
            monitor.data_ready()
            gpu.queue(0.01)
            monitor.step(4, tokens=40, loss=2.0, lr=0.1)
            gpu.drain()
            time.sleep(0.001)
            monitor.flush()
        monitor.close()
    on_gpu = [r for r in read_json_lines(RunDir(tmp_path / "gpu").rank_records(0)) if "time" in r]
    assert [r["sm_active_ratio"] for r in on_gpu] == pytest.approx([0.85, 0.2])  # each interval its own
    assert [r["tensor_active_ratio"] for r in on_gpu] == pytest.approx([0.5, 0.5])
    on_cpu = [r for r in read_json_lines(RunDir(tmp_path / "cpu").rank_records(0)) if "time" in r]
    assert len(on_cpu) == 2 and not any("sm_active_ratio" in r or "tensor_active_ratio" in r for r in on_cpu)


def test_the_report_shows_each_ranks_mean_activity_where_its_records_carry_it(tmp_path):
    from trainstack.monitoring.report.runfiles import RunFiles
    from trainstack.monitoring.report.tables import rank_rows
    from trainstack.record import IntervalRecord, Launch

    def record(step: int, seconds: float, **activity) -> IntervalRecord:
        return IntervalRecord(
            time=1000.0 + step,
            rank=0,
            step=step,
            epoch=0,
            loss=None,
            lr=None,
            samples=16,
            tokens=0,
            interval_seconds=seconds,
            data_wait_seconds=0.0,
            step_seconds=(0.1,),
            host_data_wait_seconds=0.0,
            **activity,
        )

    warm_up = record(0, 9.0, sm_active_ratio=0.0, tensor_active_ratio=0.0)  # left out: the steady window's only
    run = RunFiles(
        tmp_path,
        {
            0: [
                Launch(
                    None,
                    [
                        warm_up,
                        record(10, 1.0, sm_active_ratio=0.9, tensor_active_ratio=0.6),
                        record(20, 3.0, sm_active_ratio=0.1, tensor_active_ratio=0.0),
                    ],
                )
            ],
            1: [Launch(None, [warm_up, record(10, 1.0)])],
        },
        {},
        {},
    )
    with_gpm, without = rank_rows(run)
    assert with_gpm["SM activity"] == pytest.approx(0.3) and with_gpm["tensor activity"] == pytest.approx(0.15)
    assert (without["SM activity"], without["tensor activity"]) == (None, None)  # "-": a column for every rank
    alone = RunFiles(tmp_path, {1: [Launch(None, [warm_up, record(10, 1.0)])]}, {}, {})
    assert "SM activity" not in rank_rows(alone)[0]  # a run without GPM has no such column
