"""The exporter's NVML side, on the NVML fake: what each GPU model exports, what is omitted, how failures count,
and the sampler: scrapes served from its snapshot, the slow fields at their own cadence, a hung call.

The exporter code under test is the production code; only the `pynvml` module underneath is the fake
(monitoring/nvml_fake), answering from data shaped like real NVML answers. The sampler is driven synchronously
(`sample_now`) on a clock the test moves, not by its thread and real sleeps.
"""

from __future__ import annotations

import json
import random

import pytest

import trainstack.monitoring.nvml_fake as fake
from tests.helpers.fakes import Rig, errors, render, value
from trainstack.monitoring.exporter.gpu import CLOCK_EVENT_REASONS, COUNTERS, GAUGES

H100_UUID = "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00"


@pytest.fixture(autouse=True)
def no_fake_host_left_behind():
    yield
    fake.load(None)


def exporter(host, pcie_throughput=False) -> Rig:
    return Rig(host, pcie_throughput)


def names_for_gpu(samples, gpu: str) -> set[str]:
    return {name for name, labels in samples if ("gpu", gpu) in labels}


def test_h100_exports_every_field_in_base_units():
    rig = exporter("dgx_h100")
    samples = rig.scrape()
    gpu0 = {"gpu": "0", "uuid": H100_UUID}
    assert (
        value(
            samples,
            "trainstack_gpu_info",
            **gpu0,
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id="00000000:18:00.0",
            driver_version="550.90.07",
        )
        == 1
    )
    opt_in = {"trainstack_gpu_pcie_transmit_bytes_per_second", "trainstack_gpu_pcie_receive_bytes_per_second"}
    gpm = {metric.name for metric in (*GAUGES.values(), *COUNTERS.values()) if "GPM" in metric.origin}  # a pair's
    expected = {metric.name for metric in GAUGES.values()} - opt_in | {metric.name for metric in COUNTERS.values()}
    # GPM's series come from a pair of samples, this is the first: tests/unit/monitoring/test_exporter_gpm.py
    expected -= gpm
    assert expected <= names_for_gpu(samples, "0")
    assert value(samples, "trainstack_gpu_utilization_ratio", **gpu0) == 0.98
    assert value(samples, "trainstack_gpu_power_watts", **gpu0) == pytest.approx(612.845)
    assert value(samples, "trainstack_gpu_power_limit_watts", **gpu0) == 700
    assert value(samples, "trainstack_gpu_memory_total_bytes", **gpu0) == 85520809984
    assert value(samples, "trainstack_gpu_memory_used_bytes", **gpu0) == 61865984000
    assert value(samples, "trainstack_gpu_memory_reserved_bytes", **gpu0) == 584122368
    assert value(samples, "trainstack_gpu_sm_clock_hertz", **gpu0) == 1980e6
    assert value(samples, "trainstack_gpu_memory_clock_max_hertz", **gpu0) == 2619e6
    assert value(samples, "trainstack_gpu_power_violation_seconds_total", **gpu0) == 4120
    assert value(samples, "trainstack_gpu_energy_joules_total", **gpu0) >= 3185526.342  # mJ counter from NVML
    assert value(samples, "trainstack_gpu_memory_temperature_celsius", **gpu0) == 52
    for reason in CLOCK_EVENT_REASONS:
        assert value(samples, "trainstack_gpu_clock_event_active", **gpu0, reason=reason) == 0
    assert {dict(labels)["gpu"] for name, labels in samples if name == "trainstack_gpu_info"} == {
        str(i) for i in range(8)
    }
    assert value(samples, "trainstack_exporter_nvml_up") == 1
    assert errors(samples) == {}


def test_gpu_series_carry_only_gpu_and_uuid():
    rig = exporter("mixed")
    dimensions = {
        "trainstack_gpu_info": {"name", "pci_bus_id", "driver_version"},
        "trainstack_gpu_clock_event_active": {"reason"},
        "trainstack_gpu_gpm_info": {"supported", "reason"},
        "trainstack_gpu_link_info": {
            "pcie_generation",
            "pcie_width",
            "pcie_max_generation",
            "pcie_max_width",
            "nvlinks_active",
        },
    }
    gpu_series = [(name, labels) for name, labels in rig.scrape() if name.startswith("trainstack_gpu_")]
    assert gpu_series
    for name, labels in gpu_series:
        assert {k for k, _ in labels} == {"gpu", "uuid"} | dimensions.get(name, set()), name


def test_nvlink_traffic_is_summed_over_all_links():
    per_link = [{"start": 1000 * (link + 1), "per_second": 0} for link in range(18)]
    host = {
        "driver_version": "550.90.07",
        "gpus": [
            {
                "model": "h100_sxm5_80gb",
                "uuid": H100_UUID,
                "pci_bus_id": "00000000:18:00.0",
                "overrides": {"fields": {"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": {"per_link": per_link}}},
            }
        ],
    }
    rig = exporter(host)
    total_kib = sum(1000 * (link + 1) for link in range(18))
    assert (
        value(rig.scrape(), "trainstack_gpu_nvlink_transmit_bytes_total", gpu="0", uuid=H100_UUID) == total_kib * 1024
    )


def link_info(samples) -> dict[str, dict[str, str]]:
    """gpu index -> the labels of its trainstack_gpu_link_info series, less gpu and uuid."""
    return {
        dict(labels)["gpu"]: {k: v for k, v in labels if k not in ("gpu", "uuid")}
        for name, labels in samples
        if name == "trainstack_gpu_link_info"
    }


def test_the_links_each_gpu_has_are_served_nvlink_and_a_pcie_link_below_its_maximum():
    links = {
        "dgx_h100": link_info(exporter("dgx_h100").scrape()),
        "pcie_pair": link_info(exporter("pcie_pair").scrape()),
    }
    h100 = {
        "pcie_generation": "5",
        "pcie_width": "16",
        "pcie_max_generation": "5",
        "pcie_max_width": "16",
        "nvlinks_active": "18",
    }
    assert links["dgx_h100"] == {str(gpu): h100 for gpu in range(8)}
    a100 = {
        "pcie_generation": "4",
        "pcie_width": "16",
        "pcie_max_generation": "4",
        "pcie_max_width": "16",
        "nvlinks_active": "0",
    }  # 12 links, no bridge: none active
    assert links["pcie_pair"] == {"0": a100, "1": a100 | {"pcie_width": "8"}}


def test_a_link_call_the_driver_lacks_leaves_its_label_empty_and_is_asked_once():
    host = json.loads((fake.DATA_DIR / "hosts/mixed.json").read_text())
    host["missing_functions"] = ["nvmlDeviceGetMaxPcieLinkWidth"]
    rig = Rig(host, slow_interval=1.0)
    for _ in range(3):
        samples = rig.scrape()
    # The T4 (gpu 2) has no NVLink at all: its NVLink label is empty too, and neither is an NVML error per scrape.
    assert link_info(samples)["2"] == {
        "pcie_generation": "3",
        "pcie_width": "16",
        "pcie_max_generation": "3",
        "pcie_max_width": "",
        "nvlinks_active": "",
    }
    assert fake.call_counts()["nvmlDeviceGetMaxPcieLinkWidth"] == 4  # once per GPU, then remembered
    assert errors(samples)[("nvmlDeviceGetMaxPcieLinkWidth", "FunctionNotFound")] == 4


def test_unsupported_fields_are_omitted_and_asked_once():
    rig = exporter("mixed")  # 0: H100, 1: A100 PCIe (no active NVLink), 2: T4 (GDDR6), 3: P4 (Pascal)
    for _ in range(3):
        samples = rig.scrape()
    assert "trainstack_gpu_memory_temperature_celsius" not in names_for_gpu(samples, "2")
    assert "trainstack_gpu_memory_temperature_celsius" in names_for_gpu(samples, "1")
    assert "trainstack_gpu_energy_joules_total" not in names_for_gpu(samples, "3")
    assert "trainstack_gpu_energy_joules_total" in names_for_gpu(samples, "2")
    assert "trainstack_gpu_ecc_corrected_errors_total" not in names_for_gpu(samples, "3")
    assert "trainstack_gpu_nvlink_transmit_bytes_total" in names_for_gpu(samples, "0")
    assert "trainstack_gpu_nvlink_transmit_bytes_total" not in names_for_gpu(samples, "1")
    assert "trainstack_gpu_nvlink_transmit_bytes_total" not in names_for_gpu(samples, "2")
    # Never a sentinel: no GPU value is negative.
    assert all(v >= 0 for (name, _), v in samples.items() if name.startswith("trainstack_gpu_"))
    # NotSupported is counted once per GPU, however many scrapes follow. (The 1 s power average, which the A100
    # (GA100), T4 and P4 lack, is not asked for: nvmlDeviceGetPowerUsage answers the same where the GPU has it.)
    assert errors(samples) == {
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_MEMORY_TEMP", "NotSupported"): 2,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_NVLINK_LINK_COUNT", "NotSupported"): 2,
    }


def test_static_answers_are_read_once_not_per_scrape():
    rig = exporter("dgx_h100")
    for _ in range(5):
        rig.scrape()
    calls = fake.call_counts()
    for once in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3"):
        assert calls[once] == 8, once
    assert calls["nvmlDeviceGetMaxClockInfo"] == 8 * 2
    assert calls["nvmlDeviceGetUtilizationRates"] == 8 * 5
    assert calls["nvmlDeviceGetFieldValues"] == 8 * (1 + 5)  # NVLink count at start, then one per scrape
    assert calls["nvmlDeviceGetPcieThroughput"] == 0  # opt-in


FAST_SAMPLE_CALLS = {
    "nvmlDeviceGetUtilizationRates": 8,
    "nvmlDeviceGetMemoryInfo": 8,
    "nvmlDeviceGetTemperature": 8,
    "nvmlDeviceGetClockInfo": 16,
    "nvmlDeviceGetCurrentClocksEventReasons": 8,
    "nvmlDeviceGetPowerUsage": 8,
    "nvmlDeviceGetComputeRunningProcesses": 8,
    "nvmlDeviceGetGraphicsRunningProcesses": 8,
    "nvmlEventSetWait_v2": 1,
    "nvmlGpmSampleGet": 8,
    "nvmlGpmMetricsGet": 8,
}
# A slow sample adds, per GPU, one field-values call for the counters and the link calls: PCIe generation and width
# now and at most, and the state of each of an H100's 18 NVLinks.
SLOW_SAMPLE_CALLS = FAST_SAMPLE_CALLS | {
    "nvmlDeviceGetFieldValues": 8,
    "nvmlDeviceGetCurrPcieLinkGeneration": 8,
    "nvmlDeviceGetCurrPcieLinkWidth": 8,
    "nvmlDeviceGetMaxPcieLinkGeneration": 8,
    "nvmlDeviceGetMaxPcieLinkWidth": 8,
    "nvmlDeviceGetNvLinkState": 8 * 18,
}


def test_a_slow_sample_reads_power_limit_and_violation_counters_with_the_other_fields_in_one_call():
    rig = exporter("dgx_h100")
    rig.sample()  # GPM pairs each sample with the one before
    at_start = fake.call_counts()
    for _ in range(3):
        samples = rig.scrape()
    per_scrape = {call: n / 3 for call, n in (fake.call_counts() - at_start).items()}
    # Per GPU: utilization, memory, temperature, 2 clocks, clock events, power, the compute and graphics process
    # lists, one field-values call for the rest, and the links; per host: the Xid event poll.
    assert per_scrape == SLOW_SAMPLE_CALLS
    gpu0 = {"gpu": "0", "uuid": H100_UUID}
    assert value(samples, "trainstack_gpu_power_watts", **gpu0) == pytest.approx(612.845)
    assert value(samples, "trainstack_gpu_power_limit_watts", **gpu0) == 700
    assert value(samples, "trainstack_gpu_power_violation_seconds_total", **gpu0) == 4120
    assert value(samples, "trainstack_gpu_thermal_violation_seconds_total", **gpu0) == 0


def test_slow_fields_are_read_at_their_own_cadence_and_keep_their_last_exact_value():
    rig = Rig("dgx_h100", interval=1.0, slow_interval=30.0)
    rig.sampler.sample_now()  # the first sample reads both parts
    first = render(rig.registry)
    at_start = fake.call_counts()
    counted = []
    for second in range(1, 61):
        rig.sample()
        counted.append(fake.call_counts() - at_start)
        at_start = fake.call_counts()
        if second < 30:  # between slow reads: the counters served are the first read's, unchanged
            samples = render(rig.registry)
            for name in (
                "trainstack_gpu_energy_joules_total",
                "trainstack_gpu_power_violation_seconds_total",
                "trainstack_gpu_memory_temperature_celsius",
                "trainstack_gpu_nvlink_transmit_bytes_total",
            ):
                served = value(first, name, gpu="0", uuid=H100_UUID)
                assert served is not None and value(samples, name, gpu="0", uuid=H100_UUID) == served, name
    slow_seconds = [second for second, calls in enumerate(counted, 1) if calls["nvmlDeviceGetFieldValues"]]
    assert slow_seconds == [30, 60]
    assert all(dict(calls) == FAST_SAMPLE_CALLS for second, calls in enumerate(counted, 1) if second % 30)
    assert dict(counted[29]) == SLOW_SAMPLE_CALLS
    samples = render(rig.registry)
    energy = value(samples, "trainstack_gpu_energy_joules_total", gpu="0", uuid=H100_UUID)
    assert energy > value(first, "trainstack_gpu_energy_joules_total", gpu="0", uuid=H100_UUID)  # read again
    assert value(samples, "trainstack_exporter_gpu_sample_age_seconds", cadence="fast") == 0
    assert value(samples, "trainstack_exporter_gpu_sample_age_seconds", cadence="slow") == 0
    rig.clock.now += 7  # no sample for 7 s: both parts age
    samples = render(rig.registry)
    assert value(samples, "trainstack_exporter_gpu_sample_age_seconds", cadence="fast") == 7
    assert value(samples, "trainstack_exporter_gpu_sample_interval_seconds", cadence="slow") == 30
    assert value(samples, "trainstack_exporter_gpu_samples_total", cadence="slow") == 3
    assert value(samples, "trainstack_exporter_gpu_samples_total", cadence="fast") == 58


def test_without_the_field_values_call_power_comes_from_the_dedicated_calls():
    host = {
        "driver_version": "384.183",
        "missing_functions": ["nvmlDeviceGetFieldValues"],
        "gpus": [{"model": "p4", "uuid": "GPU-5f1c0a15-1a40-4c3d-8e64-9a0b1c2d3e15", "pci_bus_id": "00000000:2A:00.0"}],
    }
    rig = exporter(host)
    for _ in range(2):
        samples = rig.scrape()
    p4 = {"gpu": "0", "uuid": "GPU-5f1c0a15-1a40-4c3d-8e64-9a0b1c2d3e15"}
    assert value(samples, "trainstack_gpu_power_watts", **p4) == pytest.approx(41.23)
    assert value(samples, "trainstack_gpu_power_limit_watts", **p4) == 75
    assert value(samples, "trainstack_gpu_thermal_violation_seconds_total", **p4) == 0
    assert "trainstack_gpu_pcie_replays_total" not in names_for_gpu(samples, "0")  # a field with no fallback
    assert errors(samples) == {("nvmlDeviceGetFieldValues", "FunctionNotFound"): 1}


H100_WITHOUT_LIMIT_FIELD = {
    "driver_version": "550.90.07",
    "gpus": [
        {
            "model": "h100_sxm5_80gb",
            "uuid": H100_UUID,
            "pci_bus_id": "00000000:18:00.0",
            "overrides": {"fields": {"NVML_FI_DEV_POWER_CURRENT_LIMIT": "NVMLError_NotSupported"}},
        }
    ],
}


@pytest.mark.parametrize(
    "host, gpu, uuid, lacking, field_error",
    [
        # A GPU whose driver has the field but not for this GPU answers NotSupported.
        (H100_WITHOUT_LIMIT_FIELD, "0", H100_UUID, 1, "NotSupported"),
        # An R470 driver predates the power fields: it answers InvalidArgument for an id it does not know.
        ("legacy_driver", "0", "GPU-5f1c0a14-1a3f-4c3d-8e63-9a0b1c2d3e14", 2, "InvalidArgument"),
    ],
)
def test_a_field_the_gpu_or_driver_lacks_is_read_with_its_own_call(host, gpu, uuid, lacking, field_error):
    rig = exporter(host)
    answers = fake._require_host().gpus[int(gpu)].answers
    for _ in range(3):
        samples = rig.scrape()
    assert value(samples, "trainstack_gpu_power_watts", gpu=gpu, uuid=uuid) == pytest.approx(
        answers["nvmlDeviceGetPowerUsage"] / 1000
    )
    assert value(samples, "trainstack_gpu_power_limit_watts", gpu=gpu, uuid=uuid) == pytest.approx(
        answers["nvmlDeviceGetEnforcedPowerLimit"] / 1000
    )
    assert fake.call_counts()["nvmlDeviceGetEnforcedPowerLimit"] == 3 * lacking
    # The field is asked once per GPU that lacks it, then only the call is.
    assert errors(samples)[("nvmlDeviceGetFieldValues/NVML_FI_DEV_POWER_CURRENT_LIMIT", field_error)] == lacking


def test_pcie_throughput_when_asked_for():
    rig = exporter("mixed", pcie_throughput=True)
    samples = rig.scrape()
    assert (
        value(
            samples,
            "trainstack_gpu_pcie_receive_bytes_per_second",
            gpu="2",
            uuid="GPU-5f1c0a0c-1a37-4c3d-8e5b-9a0b1c2d3e0c",
        )
        == 345678 * 1024
    )


def test_legacy_driver_uses_the_older_calls():
    rig = exporter("legacy_driver")  # 0: T4 at its power cap, 1: P4
    for _ in range(3):
        samples = rig.scrape()
    t4 = {"gpu": "0", "uuid": "GPU-5f1c0a14-1a3f-4c3d-8e63-9a0b1c2d3e14"}
    assert value(samples, "trainstack_gpu_clock_event_active", **t4, reason="sw_power_cap") == 1
    assert value(samples, "trainstack_gpu_memory_total_bytes", **t4) == 16106127360
    # v1 memory info counts the driver's reservation as used, and has no separate reserved figure.
    assert value(samples, "trainstack_gpu_memory_used_bytes", **t4) == 11811160064 + 255852544
    assert "trainstack_gpu_memory_reserved_bytes" not in names_for_gpu(samples, "0")
    counted = errors(samples)
    assert counted[("nvmlDeviceGetCurrentClocksEventReasons", "FunctionNotFound")] == 2
    assert counted[("nvmlDeviceGetMemoryInfo", "FunctionNotFound")] == 2


def test_a_failing_call_is_counted_each_time_and_only_its_field_is_missing():
    rig = exporter("dgx_h100")
    fake.fail("nvmlDeviceGetTemperature", "Unknown", gpu=1, times=2)
    first, second, third = rig.scrape(), rig.scrape(), rig.scrape()
    gpu1 = {"gpu": "1", "uuid": "GPU-5f1c0a01-1a2c-4c3d-8e50-9a0b1c2d3e01"}
    assert value(first, "trainstack_gpu_temperature_celsius", **gpu1) is None
    assert value(first, "trainstack_gpu_utilization_ratio", **gpu1) == 0.98
    assert value(first, "trainstack_gpu_temperature_celsius", gpu="0", uuid=H100_UUID) is not None
    assert errors(first) == {("nvmlDeviceGetTemperature", "Unknown"): 1}
    assert errors(second) == {("nvmlDeviceGetTemperature", "Unknown"): 2}
    assert value(third, "trainstack_gpu_temperature_celsius", **gpu1) is not None


def test_a_lost_gpu_drops_out_and_is_not_asked_again():
    rig = exporter("dgx_h100")
    fake.raise_xid(3, 79)
    before = rig.scrape()
    assert "trainstack_gpu_power_watts" in names_for_gpu(before, "3")
    fake.lose_gpu(3)
    after = rig.scrape()
    calls = fake.call_counts()
    again = rig.scrape()
    gpu3 = {"gpu": "3", "uuid": "GPU-5f1c0a03-1a2e-4c3d-8e52-9a0b1c2d3e03"}
    assert names_for_gpu(after, "3") == {"trainstack_gpu_xid_errors_total"}  # the Xid that preceded it stays
    assert value(after, "trainstack_gpu_xid_errors_total", **gpu3, xid="79") == 1
    assert {g for g in range(8) if g != 3} == {
        int(g) for g in (dict(labels)["gpu"] for name, labels in after if name == "trainstack_gpu_power_watts")
    }
    assert value(after, "trainstack_exporter_gpus_lost") == 1
    assert errors(again) == {("nvmlDeviceGetUtilizationRates", "GpuIsLost"): 1}
    assert fake.call_counts()["nvmlDeviceGetUtilizationRates"] == calls["nvmlDeviceGetUtilizationRates"] + 7
    assert rig.session.health().gpus == 7


def test_xid_events_are_counted_by_code():
    host = {
        "driver_version": "550.90.07",
        "gpus": [{"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"}],
        "xid_events": [{"gpu": 0, "xid": 48, "after_seconds": 0}],
    }
    rig = exporter(host)
    fake.raise_xid(0, 13)
    fake.raise_xid(0, 13)
    first = rig.scrape()
    fake.raise_xid(0, 13)
    second = rig.scrape()
    assert value(first, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="13") == 2
    assert value(first, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="48") == 1
    assert value(second, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="13") == 3
    assert errors(second) == {}  # an empty event queue (NVMLError_Timeout) is not an error


def processes(samples) -> dict[tuple[str, str, str], float]:
    """(gpu, pid, process name) -> the memory the process uses on that GPU."""
    return {
        (labels["gpu"], labels["pid"], labels["process"]): v
        for (name, key), v in samples.items()
        if name == "trainstack_gpu_process_memory_used_bytes" and (labels := dict(key))
    }


def test_every_process_on_a_gpu_is_served_with_its_name_asked_once():
    host = {
        "driver_version": "550.90.07",
        "gpus": [
            {"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"},
            {"model": "h100_sxm5_80gb", "uuid": "GPU-b", "pci_bus_id": "00000000:2A:00.0"},
        ],
        "processes": {
            "0": [
                {"pid": 4242, "name": "/opt/conda/bin/python", "used_gpu_memory": 60129542144},
                {"pid": 777, "used_gpu_memory": 1073741824},
            ],  # another PID namespace: no name
            "1": [
                {"pid": 4242, "name": "/opt/conda/bin/python", "used_gpu_memory": 2 << 30},
                {"pid": 900, "name": "Xorg", "type": "G", "used_gpu_memory": 1 << 20},
                {"pid": 901, "name": "blender", "type": "C+G", "used_gpu_memory": 5 << 20},
            ],
        },
    }
    rig = exporter(host)
    for _ in range(3):
        samples = rig.scrape()
    assert processes(samples) == {
        ("0", "4242", "python"): 60129542144,
        ("0", "777", ""): 1073741824,
        ("1", "4242", "python"): 2 << 30,
        ("1", "900", "Xorg"): 1 << 20,
        ("1", "901", "blender"): 5 << 20,
    }  # in both lists, served once
    # Asked once per process over three samples, so a process NVML cannot name is one error, not one a sample.
    assert fake.call_counts()["nvmlSystemGetProcessName"] == 4
    assert errors(samples) == {("nvmlSystemGetProcessName", "NotFound"): 1}


def test_a_process_that_leaves_its_gpu_is_no_longer_served():
    host = {
        "driver_version": "550.90.07",
        "gpus": [{"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"}],
        "processes": {"0": [{"pid": 4242, "name": "python", "used_gpu_memory": 1 << 30}]},
    }
    rig = exporter(host)
    assert processes(rig.scrape()) == {("0", "4242", "python"): 1 << 30}
    fake._require_host().processes[0] = [{"pid": 4343, "name": "torchrun", "used_gpu_memory": 2 << 30}]
    assert processes(rig.scrape()) == {("0", "4343", "torchrun"): 2 << 30}


def test_an_r470_driver_lists_processes_through_the_v2_calls():
    host = json.loads((fake.DATA_DIR / "hosts" / "legacy_driver.json").read_text())
    host["processes"] = {"1": [{"pid": 31, "name": "python3", "used_gpu_memory": 3 << 30}]}
    rig = exporter(host)
    for _ in range(3):
        samples = rig.scrape()
    assert processes(samples) == {("1", "31", "python3"): 3 << 30}
    counted = errors(samples)  # pynvml's unversioned names call v3: tried once per GPU, then the v2 names only
    assert counted[("nvmlDeviceGetComputeRunningProcesses", "FunctionNotFound")] == 2
    assert counted[("nvmlDeviceGetGraphicsRunningProcesses", "FunctionNotFound")] == 2
    assert fake.call_counts()["nvmlDeviceGetComputeRunningProcesses_v2"] == 2 * 3


@pytest.mark.parametrize("host, error", [(None, "LibraryNotFound"), ("driver_not_loaded", "DriverNotLoaded")])
def test_no_driver_reports_nvml_down(host, error):
    rig = exporter(host)
    samples = rig.scrape()
    assert value(samples, "trainstack_exporter_nvml_up") == 0
    assert errors(samples) == {("nvmlInit", error): 1}
    assert not any(name.startswith("trainstack_gpu_") for name, _ in samples)
    assert value(samples, "trainstack_exporter_collector_success", collector="gpu") == 1
    assert error in rig.session.down_reason


def test_random_failures_never_fail_a_scrape_and_are_all_counted():
    rig = exporter("mixed")
    transient = ["Unknown", "Timeout", "NoPermission", "InsufficientSize", "NotSupported", "Memory"]
    fake.fail_randomly(0.05, transient, seed=20240611)
    for scrape_number in range(230):
        if scrape_number == 200:  # then GPUs start falling off the bus as well
            fake.fail_randomly(0.05, [*transient, "GpuIsLost"], seed=7)
        samples = rig.scrape()  # raises if a scrape failed or produced unparsable text
        assert value(samples, "trainstack_exporter_collector_success", collector="gpu") == 1
        assert value(samples, "trainstack_exporter_nvml_up") == 1
    injected = fake.injected_failures()
    assert sum(injected.values()) > 100  # the pattern did hit many calls
    counted = errors(samples)
    for (call, error), times in injected.items():
        assert counted[(call, error)] == times, (call, error)
    lost = sum(times for (_, error), times in injected.items() if error == "GpuIsLost")
    assert lost > 0
    assert value(samples, "trainstack_exporter_gpus_lost") == lost  # a lost GPU is never asked again


def test_a_thousand_random_failure_patterns_fail_no_scrape_and_no_counter_goes_back():
    rng = random.Random(14)
    errors_pool = [
        "Unknown",
        "Timeout",
        "NoPermission",
        "InsufficientSize",
        "NotSupported",
        "Memory",
        "GpuIsLost",
        "Uninitialized",
        "FunctionNotFound",
    ]
    calls = sorted(FAST_SAMPLE_CALLS) + ["nvmlDeviceGetFieldValues", "nvmlDeviceGetComputeRunningProcesses"]
    served: dict[tuple[str, frozenset], float] = {}
    for pattern in range(1000):
        if pattern % 100 == 0:  # a fresh exporter now and then, before lost GPUs leave nothing to read
            rig = Rig("mixed", interval=1.0, slow_interval=rng.choice([1.0, 3.0]))
            served = {}
        # Each pattern: a failure rate and a mix of errors on every device call, plus a run of one call failing.
        fake.fail_randomly(
            rng.choice([0.0, 0.02, 0.2, 0.6, 1.0]), rng.sample(errors_pool, rng.randint(1, 3)), seed=pattern
        )
        if rng.random() < 0.3:
            fake.fail(
                rng.choice(calls), rng.choice(errors_pool), gpu=rng.choice([None, 0, 1, 2, 3]), times=rng.randint(1, 5)
            )
        samples = rig.scrape()  # raises if a scrape failed or produced unparsable text
        assert value(samples, "trainstack_exporter_collector_success", collector="gpu") == 1, pattern
        assert value(samples, "trainstack_exporter_nvml_up") == 1, pattern
        for key, number in samples.items():
            if key[0].startswith("trainstack_gpu_") and key[0].endswith("_total"):
                assert number >= served.get(key, number), (pattern, key)  # exact values, never one going back
                served[key] = number
    assert sum(fake.injected_failures().values()) > 100
