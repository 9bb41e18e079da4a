"""GPU collector: turns the sampler's latest snapshot into `trainstack_gpu_*` metric families at each scrape,
without calling NVML (monitoring/exporter/sampler.py reads it).

Every GPU series carries `gpu` (the NVML index) and `uuid` and nothing else that identifies the GPU; name, driver
and PCI bus are on `trainstack_gpu_info`. A field that is None in the sample is omitted (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from monitoring.exporter.sampler import Sampler

GPU_LABELS = ["gpu", "uuid"]

# GpuSample attribute -> (metric name, help). Counter names get `_total` from prometheus_client.
GAUGES = {
    "utilization_ratio": ("trainstack_gpu_utilization_ratio",
                          "Share of the last sample period in which a kernel was running (not SM occupancy)."),
    "memory_busy_ratio": ("trainstack_gpu_memory_busy_ratio",
                          "Share of the last sample period in which device memory was read or written."),
    "memory_used_bytes": ("trainstack_gpu_memory_used_bytes", "Device memory in use."),
    "memory_total_bytes": ("trainstack_gpu_memory_total_bytes", "Device memory installed."),
    "memory_reserved_bytes": ("trainstack_gpu_memory_reserved_bytes", "Device memory the driver reserves."),
    "power_watts": ("trainstack_gpu_power_watts", "Power draw."),
    "power_limit_watts": ("trainstack_gpu_power_limit_watts", "Enforced power limit."),
    "temperature_celsius": ("trainstack_gpu_temperature_celsius", "GPU core temperature."),
    "memory_temperature_celsius": ("trainstack_gpu_memory_temperature_celsius", "Device memory (HBM) temperature."),
    "sm_clock_hertz": ("trainstack_gpu_sm_clock_hertz", "Current SM clock."),
    "memory_clock_hertz": ("trainstack_gpu_memory_clock_hertz", "Current memory clock."),
    "pcie_transmit_bytes_per_second": ("trainstack_gpu_pcie_transmit_bytes_per_second",
                                       "PCIe transmit throughput over NVML's 20 ms window (opt-in)."),
    "pcie_receive_bytes_per_second": ("trainstack_gpu_pcie_receive_bytes_per_second",
                                      "PCIe receive throughput over NVML's 20 ms window (opt-in)."),
}
COUNTERS = {
    "energy_joules": ("trainstack_gpu_energy_joules", "Energy consumed since the driver was loaded."),
    "power_violation_seconds": ("trainstack_gpu_power_violation_seconds",
                                "Time the clocks were held down by the power limit."),
    "thermal_violation_seconds": ("trainstack_gpu_thermal_violation_seconds",
                                  "Time the clocks were held down by temperature."),
    "pcie_replays": ("trainstack_gpu_pcie_replays", "PCIe packets retransmitted."),
    "ecc_corrected_errors": ("trainstack_gpu_ecc_corrected_errors",
                             "Single-bit ECC errors corrected since the driver was loaded."),
    "ecc_uncorrected_errors": ("trainstack_gpu_ecc_uncorrected_errors",
                               "Double-bit ECC errors since the driver was loaded."),
    "nvlink_transmit_bytes": ("trainstack_gpu_nvlink_transmit_bytes", "Data sent over all NVLinks."),
    "nvlink_receive_bytes": ("trainstack_gpu_nvlink_receive_bytes", "Data received over all NVLinks."),
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


class GpuCollector:
    name = "gpu"

    def __init__(self, sampler: Sampler):
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        reading = self._sampler.snapshot()
        info = InfoMetricFamily("trainstack_gpu", "The GPU: model name, PCI bus id and driver version.",
                                labels=GPU_LABELS)
        sm_max = GaugeMetricFamily("trainstack_gpu_sm_clock_max_hertz", "Maximum SM clock.", labels=GPU_LABELS)
        memory_max = GaugeMetricFamily("trainstack_gpu_memory_clock_max_hertz", "Maximum memory clock.",
                                       labels=GPU_LABELS)
        for gpu in reading.gpus:
            labels = [str(gpu.index), gpu.uuid]
            info.add_metric(labels, {"name": gpu.name, "pci_bus_id": gpu.pci_bus_id,
                                     "driver_version": reading.driver_version})
            _add(sm_max, labels, gpu.sm_clock_max_hertz)
            _add(memory_max, labels, gpu.memory_clock_max_hertz)

        gauges = {a: GaugeMetricFamily(n, h, labels=GPU_LABELS) for a, (n, h) in GAUGES.items()}
        counters = {a: CounterMetricFamily(n, h, labels=GPU_LABELS) for a, (n, h) in COUNTERS.items()}
        reasons = GaugeMetricFamily("trainstack_gpu_clock_event_active",
                                    "1 while this reason holds the clocks down (clocks event / throttle reason).",
                                    labels=[*GPU_LABELS, "reason"])
        processes = GaugeMetricFamily("trainstack_gpu_process_memory_used_bytes",
                                      "Device memory used by one process of the training job.",
                                      labels=[*GPU_LABELS, "pid"])
        for sample in reading.samples:
            labels = [str(sample.index), sample.uuid]
            for attribute, family in (gauges | counters).items():
                _add(family, labels, getattr(sample, attribute))
            if sample.clock_event_reasons is not None:
                for reason, bit in CLOCK_EVENT_REASONS.items():
                    reasons.add_metric([*labels, reason], 1.0 if sample.clock_event_reasons & bit else 0.0)
            for pid, used in sorted(sample.process_memory_bytes.items()):
                processes.add_metric([*labels, str(pid)], used)

        xids = CounterMetricFamily("trainstack_gpu_xid_errors",
                                   "Xid errors the driver reported (NVML critical Xid events), by Xid code.",
                                   labels=[*GPU_LABELS, "xid"])
        for (index, uuid, xid), count in sorted(reading.xid_errors.items()):
            xids.add_metric([str(index), uuid, str(xid)], count)

        for family in (info, sm_max, memory_max, *gauges.values(), *counters.values(), reasons, processes, xids):
            if family.samples:
                yield family


def _add(family: Metric, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))
