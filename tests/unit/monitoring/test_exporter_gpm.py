"""GPM in the exporter (monitoring/exporter/gpm.py) on the NVML fake: each period's pair of samples gives each
metric's mean, as ratios and byte counters; where GPM cannot answer the series are absent and the info series says
why; a failing GPM call is counted and fails nothing else; the scrape passes promtool. The sampler is driven by
`sample_now` on a clock the test moves (tests/unit/monitoring/test_exporter_nvml.py's Rig)."""

from __future__ import annotations

import pytest

import trainstack.monitoring.nvml_fake as fake
from tests.helpers.fakes import errors, render, rig, value
from trainstack import catalog

GPM_SERIES = {
    catalog.GPU_SM_ACTIVE.name,
    catalog.GPU_SM_OCCUPANCY.name,
    catalog.GPU_TENSOR_ACTIVE.name,
    catalog.GPU_DRAM_ACTIVE.name,
    catalog.GPU_GPM_PCIE_TRANSMIT.name,
    catalog.GPU_GPM_PCIE_RECEIVE.name,
    catalog.GPU_GPM_NVLINK_TRANSMIT.name,
    catalog.GPU_GPM_NVLINK_RECEIVE.name,
}
MIB = 1 << 20


@pytest.fixture(autouse=True)
def no_fake_host_left_behind():
    yield
    fake.load(None)


def gpm_series(samples, gpu: str) -> set[str]:
    return {name for name, labels in samples if ("gpu", gpu) in labels and name in GPM_SERIES}


def gpm_info(samples) -> dict[str, dict[str, str]]:
    return {dict(labels)["gpu"]: dict(labels) for name, labels in samples if name == catalog.GPU_GPM_INFO.name}


def test_a_pair_of_samples_gives_each_metrics_mean_over_the_period_between_them():
    exporter = rig("ddp_h100")
    first = exporter.scrape()  # the first sample: no pair yet, so no GPM series
    assert gpm_series(first, "0") == set()
    assert gpm_info(first)["0"] == {
        "gpu": "0",
        "uuid": "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00",
        "supported": "true",
        "reason": "",
    }
    samples = exporter.scrape()  # one interval (1 s) later: the pair [start, now]
    gpu0 = {"gpu": "0", "uuid": "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00"}
    assert gpm_series(samples, "0") == GPM_SERIES
    assert value(samples, "trainstack_gpu_sm_active_ratio", **gpu0) == pytest.approx(0.85)
    assert value(samples, "trainstack_gpu_sm_occupancy_ratio", **gpu0) == pytest.approx(0.40)
    assert value(samples, "trainstack_gpu_tensor_active_ratio", **gpu0) == pytest.approx(0.50)
    assert value(samples, "trainstack_gpu_dram_active_ratio", **gpu0) == pytest.approx(0.45)
    # MiB/s over the 1 s period, added up into bytes.
    assert value(samples, "trainstack_gpu_gpm_pcie_receive_bytes_total", **gpu0) == pytest.approx(1100 * MIB)
    assert value(samples, "trainstack_gpu_gpm_nvlink_transmit_bytes_total", **gpu0) == pytest.approx(30000 * MIB)

    # The next period: the GPU turns hollow; its pair reads the new figures, not a mix with the old ones.
    fake.set_gpm(0, {"NVML_GPM_METRIC_SM_UTIL": 15.0, "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 100.0})
    exporter.clock.now += 1.0  # a 2 s period: the counter adds rate x 2 s
    samples = exporter.scrape()
    assert value(samples, "trainstack_gpu_sm_active_ratio", **gpu0) == pytest.approx(0.15)
    assert value(samples, "trainstack_gpu_tensor_active_ratio", **gpu0) == pytest.approx(0.50)
    assert value(samples, "trainstack_gpu_gpm_pcie_receive_bytes_total", **gpu0) == pytest.approx(
        1100 * MIB + 100 * MIB * 2
    )
    assert value(
        samples, "trainstack_gpu_sm_active_ratio", gpu="1", uuid="GPU-5f1c0a01-1a2c-4c3d-8e50-9a0b1c2d3e01"
    ) == pytest.approx(0.85)  # set per GPU
    assert errors(samples) == {}


def test_two_gpm_calls_per_gpu_per_period_and_none_at_a_scrape():
    exporter = rig("ddp_h100")
    exporter.sample()
    before = fake.call_counts()
    exporter.sample()
    after = fake.call_counts()
    assert after["nvmlGpmSampleGet"] - before["nvmlGpmSampleGet"] == 4  # one per GPU
    assert after["nvmlGpmMetricsGet"] - before["nvmlGpmMetricsGet"] == 4
    assert after["nvmlGpmSampleAlloc"] == 8  # two buffers per GPU, once
    render(exporter.registry)
    assert fake.call_counts() == after


def test_a_gpm_period_longer_than_the_sample_interval_serves_each_pairs_means_until_the_next():
    exporter = rig("ddp_h100", gpm_interval=5.0)  # a 1 s sampler, a GPM sample every 5 s
    gpu0 = {"gpu": "0", "uuid": "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00"}
    started = fake.call_counts()["nvmlGpmSampleGet"]
    for _ in range(5):  # the first GPM sample, then 1-4 s after it: no pair yet
        assert gpm_series(exporter.scrape(), "0") == set()
    samples = exporter.scrape()  # 5 s after the first: the pair closes, its means over 5 s
    assert value(samples, "trainstack_gpu_sm_active_ratio", **gpu0) == pytest.approx(0.85)
    assert value(samples, "trainstack_gpu_gpm_pcie_receive_bytes_total", **gpu0) == pytest.approx(1100 * MIB * 5)
    fake.set_gpm(0, {"NVML_GPM_METRIC_SM_UTIL": 15.0})
    for _ in range(4):  # the next period's samples serve the last pair's means, and take no GPM sample
        assert value(exporter.scrape(), "trainstack_gpu_sm_active_ratio", **gpu0) == pytest.approx(0.85)
    assert fake.call_counts()["nvmlGpmSampleGet"] - started == 2 * 4  # at 0 s and 5 s, on each of the 4 GPUs
    assert value(exporter.scrape(), "trainstack_gpu_sm_active_ratio", **gpu0) == pytest.approx(0.15)  # 10 s


@pytest.mark.parametrize(
    "host, gpu, reason",
    [
        ("legacy_driver", "0", "the GPU has no GPM (Hopper and newer have it)"),  # T4
        ("mixed", "1", "the GPU has no GPM (Hopper and newer have it)"),  # A100
    ],
)
def test_a_gpu_without_gpm_has_none_of_its_series_and_its_info_says_why(host, gpu, reason):
    samples = rig(host).scrape()
    assert gpm_series(samples, gpu) == set()
    assert gpm_info(samples)[gpu]["supported"] == "false" and gpm_info(samples)[gpu]["reason"] == reason
    assert not any(call.startswith("nvmlGpm") for call, _ in errors(samples))  # a GPU without GPM is no error


def one_h100(**host) -> dict:
    return {
        "driver_version": "535.104.05",
        **host,
        "gpus": [
            {
                "model": "h100_sxm5_80gb",
                "uuid": "GPU-0",
                "pci_bus_id": "00000000:18:00.0",
                **({"overrides": host.pop("overrides")} if "overrides" in host else {}),
            }
        ],
    }


def test_a_driver_without_gpm_says_so_counts_the_call_once_and_serves_everything_else():
    exporter = rig(one_h100(missing_functions=["nvmlGpmQueryDeviceSupport"]))
    exporter.sample()
    samples = exporter.scrape()
    assert gpm_series(samples, "0") == set()
    assert gpm_info(samples)["0"]["reason"] == "nvmlGpmQueryDeviceSupport: FunctionNotFound"
    assert errors(samples) == {("nvmlGpmQueryDeviceSupport", "FunctionNotFound"): 1}
    assert value(samples, "trainstack_gpu_utilization_ratio", gpu="0", uuid="GPU-0") == 0.98


def test_a_mig_mode_gpu_whose_whole_gpu_samples_nvml_refuses_stops_asking_and_frees_its_buffers():
    exporter = rig(one_h100(overrides={"gpm": "NVMLError_NotSupported"}))
    exporter.sample()
    samples = exporter.scrape()
    assert gpm_series(samples, "0") == set()
    assert gpm_info(samples)["0"] == {
        "gpu": "0",
        "uuid": "GPU-0",
        "supported": "false",
        "reason": "nvmlGpmSampleGet: NotSupported",
    }
    assert errors(samples) == {("nvmlGpmSampleGet", "NotSupported"): 1}
    assert fake.call_counts()["nvmlGpmSampleFree"] == 2


def test_a_failed_sample_skips_its_periods_and_a_metric_the_gpu_lacks_is_omitted_and_asked_once():
    exporter = rig(one_h100(overrides={"gpm": {"NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": "NVMLError_NotSupported"}}))
    exporter.sample()
    fake.fail("nvmlGpmSampleGet", "Unknown")
    samples = exporter.scrape()  # this period's sample failed: no pair, the previous figures are not repeated
    assert catalog.GPU_SM_ACTIVE.name not in {name for name, _ in samples}
    samples = exporter.scrape()  # the next sample has no predecessor either
    assert catalog.GPU_SM_ACTIVE.name not in {name for name, _ in samples}
    samples = exporter.scrape()
    assert value(samples, "trainstack_gpu_sm_active_ratio", gpu="0", uuid="GPU-0") == pytest.approx(0.85)
    assert catalog.GPU_GPM_NVLINK_TRANSMIT.name not in {name for name, _ in samples}
    assert catalog.GPU_GPM_NVLINK_RECEIVE.name in {name for name, _ in samples}
    exporter.scrape()
    assert errors(exporter.scrape()) == {
        ("nvmlGpmSampleGet", "Unknown"): 1,
        ("nvmlGpmMetricsGet/NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "NotSupported"): 1,
    }
