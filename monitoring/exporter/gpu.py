"""GPU collector: turns the sampler's latest snapshot into the GPU metric families at each scrape,
without calling NVML (monitoring/exporter/sampler.py reads it).

Every GPU series carries `gpu` (the NVML index) and `uuid` and nothing else that identifies the GPU; name, driver
and PCI bus are on the info metric. A field that is None in the sample is omitted (docs/metrics.md). The metrics
themselves (names, help, labels) are trainstack/catalog.py's.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainstack import catalog
from trainstack.monitoring.exporter.nvml import LINK_ATTRIBUTES
from trainstack.monitoring.exporter.sampler import Sampler

# GpuSample attribute -> the metric it is served as.
GAUGES = {
    "utilization_ratio": catalog.GPU_UTILIZATION,
    "memory_busy_ratio": catalog.GPU_MEMORY_BUSY,
    "memory_used_bytes": catalog.GPU_MEMORY_USED,
    "memory_total_bytes": catalog.GPU_MEMORY_TOTAL,
    "memory_reserved_bytes": catalog.GPU_MEMORY_RESERVED,
    "power_watts": catalog.GPU_POWER,
    "power_limit_watts": catalog.GPU_POWER_LIMIT,
    "temperature_celsius": catalog.GPU_TEMPERATURE,
    "memory_temperature_celsius": catalog.GPU_MEMORY_TEMPERATURE,
    "sm_clock_hertz": catalog.GPU_SM_CLOCK,
    "memory_clock_hertz": catalog.GPU_MEMORY_CLOCK,
    "pcie_transmit_bytes_per_second": catalog.GPU_PCIE_TRANSMIT,
    "pcie_receive_bytes_per_second": catalog.GPU_PCIE_RECEIVE,
    "sm_active_ratio": catalog.GPU_SM_ACTIVE,
    "sm_occupancy_ratio": catalog.GPU_SM_OCCUPANCY,
    "tensor_active_ratio": catalog.GPU_TENSOR_ACTIVE,
    "dram_active_ratio": catalog.GPU_DRAM_ACTIVE,
}
COUNTERS = {
    "energy_joules": catalog.GPU_ENERGY,
    "power_violation_seconds": catalog.GPU_POWER_VIOLATION,
    "thermal_violation_seconds": catalog.GPU_THERMAL_VIOLATION,
    "pcie_replays": catalog.GPU_PCIE_REPLAYS,
    "ecc_corrected_errors": catalog.GPU_ECC_CORRECTED,
    "ecc_uncorrected_errors": catalog.GPU_ECC_UNCORRECTED,
    "nvlink_transmit_bytes": catalog.GPU_NVLINK_TRANSMIT,
    "nvlink_receive_bytes": catalog.GPU_NVLINK_RECEIVE,
    "gpm_pcie_transmit_bytes": catalog.GPU_GPM_PCIE_TRANSMIT,
    "gpm_pcie_receive_bytes": catalog.GPU_GPM_PCIE_RECEIVE,
    "gpm_nvlink_transmit_bytes": catalog.GPU_GPM_NVLINK_TRANSMIT,
    "gpm_nvlink_receive_bytes": catalog.GPU_GPM_NVLINK_RECEIVE,
}
# Bits of nvmlDeviceGetCurrentClocksEventReasons (NVML's clocks-event / throttle reasons).
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class GpuCollector(Collector):
    name = "gpu"

    def __init__(self, sampler: Sampler):
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        reading = self._sampler.snapshot()
        info = catalog.family(catalog.GPU_INFO, labels=catalog.GPU_LABELS)  # name, bus, driver come with each value
        sm_max = catalog.family(catalog.GPU_SM_CLOCK_MAX)
        memory_max = catalog.family(catalog.GPU_MEMORY_CLOCK_MAX)
        for gpu in reading.gpus:
            labels = [str(gpu.index), gpu.uuid]
            info.add_metric(
                labels, {"name": gpu.name, "pci_bus_id": gpu.pci_bus_id, "driver_version": reading.driver_version}
            )
            _add(sm_max, labels, gpu.sm_clock_max_hertz)
            _add(memory_max, labels, gpu.memory_clock_max_hertz)

        fields = {attribute: catalog.family(metric) for attribute, metric in (GAUGES | COUNTERS).items()}
        reasons = catalog.family(catalog.GPU_CLOCK_EVENT_ACTIVE)
        processes = catalog.family(catalog.GPU_PROCESS_MEMORY_USED)
        for sample in reading.samples:
            labels = [str(sample.index), sample.uuid]
            for attribute, family in fields.items():
                _add(family, labels, getattr(sample, attribute))
            if sample.clock_event_reasons is not None:
                for reason, bit in CLOCK_EVENT_REASONS.items():
                    reasons.add_metric([*labels, reason], 1.0 if sample.clock_event_reasons & bit else 0.0)
            for pid, used in sorted(sample.process_memory_bytes.items()):
                processes.add_metric([*labels, str(pid), reading.process_names.get(pid, "")], used)

        xids = catalog.family(catalog.GPU_XID_ERRORS)
        for (index, uuid, xid), count in sorted(reading.xid_errors.items()):
            xids.add_metric([str(index), uuid, str(xid)], count)

        links = catalog.family(catalog.GPU_LINK_INFO, labels=catalog.GPU_LABELS)
        for sample in reading.samples:
            answered = {attribute: getattr(sample, attribute) for attribute in LINK_ATTRIBUTES}
            if any(value is not None for value in answered.values()):  # "": the driver lacks that call
                links.add_metric(
                    [str(sample.index), sample.uuid],
                    {name: "" if value is None else str(value) for name, value in answered.items()},
                )

        gpm = catalog.family(catalog.GPU_GPM_INFO, labels=catalog.GPU_LABELS)
        for gpu in reading.gpus:
            if gpu.gpm is not None:  # None: the GPU was lost while it was being described
                gpm.add_metric(
                    [str(gpu.index), gpu.uuid], {"supported": str(gpu.gpm.supported).lower(), "reason": gpu.gpm.reason}
                )

        for family in (info, sm_max, memory_max, *fields.values(), reasons, processes, xids, links, gpm):
            if family.samples:
                yield family


def _add(family: CounterMetricFamily | GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))
