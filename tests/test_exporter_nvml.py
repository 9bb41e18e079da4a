"""The exporter's NVML side, on the NVML fake: what each GPU model exports, what is omitted, how failures count.

The exporter code under test is the production code; only the `pynvml` module underneath is the fake
(tests/nvml_fake), answering from data shaped like real NVML answers.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import tests.nvml_fake as fake
from monitoring.exporter.app import build_registry
from monitoring.exporter.config import ExporterConfig
from monitoring.exporter.gpu import CLOCK_EVENT_REASONS, COUNTERS, GAUGES
from monitoring.exporter.nvml import NvmlSession

H100_UUID = "GPU-5f1c0a00-1a2b-4c3d-8e4f-9a0b1c2d3e00"


@pytest.fixture(autouse=True)
def no_fake_host_left_behind():
    yield
    fake.load(None)


def exporter(host, pcie_throughput=False, metrics_dir=None):
    """An NVML session and registry on the fake `host`, as the exporter builds them."""
    fake.load(host)
    config = ExporterConfig(port=0, nvml_module="tests.nvml_fake", pcie_throughput=pcie_throughput,
                            metrics_dir=metrics_dir)
    session = NvmlSession(fake, pcie_throughput=pcie_throughput)
    return session, build_registry(config, session)


def scrape(registry) -> dict[tuple[str, frozenset], float]:
    """One scrape through the exposition format: (sample name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, metric, **labels):
    return samples.get((metric, frozenset(labels.items())))


def names_for_gpu(samples, gpu: str) -> set[str]:
    return {name for name, labels in samples if ("gpu", gpu) in labels}


def errors(samples) -> dict[tuple[str, str], float]:
    return {(dict(labels)["call"], dict(labels)["error"]): v for (name, labels), v in samples.items()
            if name == "trainstack_exporter_nvml_errors_total"}


def test_h100_exports_every_field_in_base_units():
    _, registry = exporter("dgx_h100")
    samples = scrape(registry)
    gpu0 = {"gpu": "0", "uuid": H100_UUID}
    assert value(samples, "trainstack_gpu_info", **gpu0, name="NVIDIA H100 80GB HBM3",
                 pci_bus_id="00000000:18:00.0", driver_version="550.90.07") == 1
    opt_in = {"trainstack_gpu_pcie_transmit_bytes_per_second", "trainstack_gpu_pcie_receive_bytes_per_second"}
    expected = {name for name, _ in GAUGES.values()} - opt_in | {f"{name}_total" for name, _ in COUNTERS.values()}
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
        str(i) for i in range(8)}
    assert value(samples, "trainstack_exporter_nvml_up") == 1
    assert errors(samples) == {}


def test_gpu_series_carry_only_gpu_and_uuid():
    _, registry = exporter("mixed")
    dimensions = {"trainstack_gpu_info": {"name", "pci_bus_id", "driver_version"},
                  "trainstack_gpu_clock_event_active": {"reason"}}
    for (name, labels) in scrape(registry):
        if name.startswith("trainstack_gpu_"):
            assert {k for k, _ in labels} == {"gpu", "uuid"} | dimensions.get(name, set()), name


def test_nvlink_traffic_is_summed_over_all_links():
    per_link = [{"start": 1000 * (link + 1), "per_second": 0} for link in range(18)]
    host = {"driver_version": "550.90.07", "gpus": [{
        "model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0",
        "overrides": {"fields": {"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": {"per_link": per_link}}}}]}
    _, registry = exporter(host)
    total_kib = sum(1000 * (link + 1) for link in range(18))
    assert value(scrape(registry), "trainstack_gpu_nvlink_transmit_bytes_total", gpu="0",
                 uuid=H100_UUID) == total_kib * 1024


def test_unsupported_fields_are_omitted_and_asked_once():
    _, registry = exporter("mixed")  # 0: H100, 1: A100 PCIe (no active NVLink), 2: T4 (GDDR6), 3: P4 (Pascal)
    for _ in range(3):
        samples = scrape(registry)
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
    # NotSupported is counted once per GPU, however many scrapes follow.
    assert errors(samples) == {
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_POWER_AVERAGE", "NotSupported"): 3,  # A100 (GA100), T4, P4
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_MEMORY_TEMP", "NotSupported"): 2,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NotSupported"): 1,
        ("nvmlDeviceGetFieldValues/NVML_FI_DEV_NVLINK_LINK_COUNT", "NotSupported"): 2,
    }


def test_static_answers_are_read_once_not_per_scrape():
    _, registry = exporter("dgx_h100")
    for _ in range(5):
        scrape(registry)
    calls = fake.call_counts()
    for once in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3"):
        assert calls[once] == 8, once
    assert calls["nvmlDeviceGetMaxClockInfo"] == 8 * 2
    assert calls["nvmlDeviceGetUtilizationRates"] == 8 * 5
    assert calls["nvmlDeviceGetFieldValues"] == 8 * (1 + 5)  # NVLink count at start, then one per scrape
    assert calls["nvmlDeviceGetPcieThroughput"] == 0  # opt-in


def test_power_and_violation_counters_come_with_the_other_fields_in_one_call():
    _, registry = exporter("dgx_h100")
    at_start = fake.call_counts()
    for _ in range(3):
        samples = scrape(registry)
    per_scrape = {call: n / 3 for call, n in (fake.call_counts() - at_start).items()}
    # Per GPU: utilization, memory, temperature, 2 clocks, clock events and one field-values call for the rest
    # (no process listing: no metrics directory, so no job pids); per host: the Xid event poll.
    assert per_scrape == {"nvmlDeviceGetUtilizationRates": 8, "nvmlDeviceGetMemoryInfo": 8,
                          "nvmlDeviceGetTemperature": 8, "nvmlDeviceGetClockInfo": 16,
                          "nvmlDeviceGetCurrentClocksEventReasons": 8, "nvmlDeviceGetFieldValues": 8,
                          "nvmlEventSetWait_v2": 1}
    gpu0 = {"gpu": "0", "uuid": H100_UUID}
    assert value(samples, "trainstack_gpu_power_watts", **gpu0) == pytest.approx(612.845)
    assert value(samples, "trainstack_gpu_power_violation_seconds_total", **gpu0) == 4120
    assert value(samples, "trainstack_gpu_thermal_violation_seconds_total", **gpu0) == 0


def test_without_the_field_values_call_power_comes_from_the_dedicated_calls():
    host = {"driver_version": "384.183", "missing_functions": ["nvmlDeviceGetFieldValues"],
            "gpus": [{"model": "p4", "uuid": "GPU-5f1c0a15-1a40-4c3d-8e64-9a0b1c2d3e15",
                      "pci_bus_id": "00000000:2A:00.0"}]}
    _, registry = exporter(host)
    for _ in range(2):
        samples = scrape(registry)
    p4 = {"gpu": "0", "uuid": "GPU-5f1c0a15-1a40-4c3d-8e64-9a0b1c2d3e15"}
    assert value(samples, "trainstack_gpu_power_watts", **p4) == pytest.approx(41.23)
    assert value(samples, "trainstack_gpu_power_limit_watts", **p4) == 75
    assert value(samples, "trainstack_gpu_thermal_violation_seconds_total", **p4) == 0
    assert "trainstack_gpu_pcie_replays_total" not in names_for_gpu(samples, "0")  # a field with no fallback
    assert errors(samples) == {("nvmlDeviceGetFieldValues", "FunctionNotFound"): 1}


@pytest.mark.parametrize("host, gpu, uuid, lacking, field_error", [
    # A100 (GA100), T4 and P4 have no 1 s power average; the H100 of the mixed host has.
    ("mixed", "1", "GPU-5f1c0a0b-1a36-4c3d-8e5a-9a0b1c2d3e0b", 3, "NotSupported"),
    # An R470 driver predates the power fields: it answers InvalidArgument for an id it does not know.
    ("legacy_driver", "0", "GPU-5f1c0a14-1a3f-4c3d-8e63-9a0b1c2d3e14", 2, "InvalidArgument"),
])
def test_a_field_the_gpu_or_driver_lacks_is_read_with_its_own_call(host, gpu, uuid, lacking, field_error):
    _, registry = exporter(host)
    answers = fake._require_host().gpus[int(gpu)].answers
    for _ in range(3):
        samples = scrape(registry)
    assert value(samples, "trainstack_gpu_power_watts", gpu=gpu, uuid=uuid) == pytest.approx(
        answers["nvmlDeviceGetPowerUsage"] / 1000)
    assert value(samples, "trainstack_gpu_power_limit_watts", gpu=gpu, uuid=uuid) == pytest.approx(
        answers["nvmlDeviceGetEnforcedPowerLimit"] / 1000)
    assert fake.call_counts()["nvmlDeviceGetPowerUsage"] == 3 * lacking
    # The field is asked once per GPU that lacks it, then only the call is.
    assert errors(samples)[("nvmlDeviceGetFieldValues/NVML_FI_DEV_POWER_AVERAGE", field_error)] == lacking


def test_pcie_throughput_when_asked_for():
    _, registry = exporter("mixed", pcie_throughput=True)
    samples = scrape(registry)
    assert value(samples, "trainstack_gpu_pcie_receive_bytes_per_second", gpu="2",
                 uuid="GPU-5f1c0a0c-1a37-4c3d-8e5b-9a0b1c2d3e0c") == 345678 * 1024


def test_legacy_driver_uses_the_older_calls():
    _, registry = exporter("legacy_driver")  # 0: T4 at its power cap, 1: P4
    for _ in range(3):
        samples = scrape(registry)
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
    _, registry = exporter("dgx_h100")
    fake.fail("nvmlDeviceGetTemperature", "Unknown", gpu=1, times=2)
    first, second, third = scrape(registry), scrape(registry), scrape(registry)
    gpu1 = {"gpu": "1", "uuid": "GPU-5f1c0a01-1a2c-4c3d-8e50-9a0b1c2d3e01"}
    assert value(first, "trainstack_gpu_temperature_celsius", **gpu1) is None
    assert value(first, "trainstack_gpu_utilization_ratio", **gpu1) == 0.98
    assert value(first, "trainstack_gpu_temperature_celsius", gpu="0", uuid=H100_UUID) is not None
    assert errors(first) == {("nvmlDeviceGetTemperature", "Unknown"): 1}
    assert errors(second) == {("nvmlDeviceGetTemperature", "Unknown"): 2}
    assert value(third, "trainstack_gpu_temperature_celsius", **gpu1) is not None


def test_a_lost_gpu_drops_out_and_is_not_asked_again():
    session, registry = exporter("dgx_h100")
    fake.raise_xid(3, 79)
    before = scrape(registry)
    assert "trainstack_gpu_power_watts" in names_for_gpu(before, "3")
    fake.lose_gpu(3)
    after = scrape(registry)
    calls = fake.call_counts()
    again = scrape(registry)
    gpu3 = {"gpu": "3", "uuid": "GPU-5f1c0a03-1a2e-4c3d-8e52-9a0b1c2d3e03"}
    assert names_for_gpu(after, "3") == {"trainstack_gpu_xid_errors_total"}  # the Xid that preceded it stays
    assert value(after, "trainstack_gpu_xid_errors_total", **gpu3, xid="79") == 1
    assert {g for g in range(8) if g != 3} == {int(g) for g in (
        dict(labels)["gpu"] for name, labels in after if name == "trainstack_gpu_power_watts")}
    assert value(after, "trainstack_exporter_gpus_lost") == 1
    assert errors(again) == {("nvmlDeviceGetUtilizationRates", "GpuIsLost"): 1}
    assert fake.call_counts()["nvmlDeviceGetUtilizationRates"] == calls["nvmlDeviceGetUtilizationRates"] + 7
    assert session.health().gpus == 7


def test_xid_events_are_counted_by_code():
    host = {"driver_version": "550.90.07",
            "gpus": [{"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"}],
            "xid_events": [{"gpu": 0, "xid": 48, "after_seconds": 0}]}
    _, registry = exporter(host)
    fake.raise_xid(0, 13)
    fake.raise_xid(0, 13)
    first = scrape(registry)
    fake.raise_xid(0, 13)
    second = scrape(registry)
    assert value(first, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="13") == 2
    assert value(first, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="48") == 1
    assert value(second, "trainstack_gpu_xid_errors_total", gpu="0", uuid=H100_UUID, xid="13") == 3
    assert errors(second) == {}  # an empty event queue (NVMLError_Timeout) is not an error


def test_process_memory_only_for_the_jobs_processes():
    host = {"driver_version": "550.90.07",
            "gpus": [{"model": "h100_sxm5_80gb", "uuid": H100_UUID, "pci_bus_id": "00000000:18:00.0"}],
            "processes": {"0": [{"pid": 4242, "used_gpu_memory": 60129542144},
                                {"pid": 777, "used_gpu_memory": 1073741824}]}}
    fake.load(host)
    session = NvmlSession(fake)
    sample = session.read(frozenset({4242, 4343})).samples[0]
    assert sample.process_memory_bytes == {4242: 60129542144}
    assert session.read().samples[0].process_memory_bytes == {}


@pytest.mark.parametrize("host, error", [(None, "LibraryNotFound"), ("driver_not_loaded", "DriverNotLoaded")])
def test_no_driver_reports_nvml_down(host, error):
    session, registry = exporter(host)
    samples = scrape(registry)
    assert value(samples, "trainstack_exporter_nvml_up") == 0
    assert errors(samples) == {("nvmlInit", error): 1}
    assert not any(name.startswith("trainstack_gpu_") for name, _ in samples)
    assert value(samples, "trainstack_exporter_collector_success", collector="gpu") == 1
    assert error in session.down_reason


def test_random_failures_never_fail_a_scrape_and_are_all_counted():
    _, registry = exporter("mixed")
    transient = ["Unknown", "Timeout", "NoPermission", "InsufficientSize", "NotSupported", "Memory"]
    fake.fail_randomly(0.05, transient, seed=20240611)
    for scrape_number in range(230):
        if scrape_number == 200:  # then GPUs start falling off the bus as well
            fake.fail_randomly(0.05, [*transient, "GpuIsLost"], seed=7)
        samples = scrape(registry)  # raises if a scrape failed or produced unparsable text
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
