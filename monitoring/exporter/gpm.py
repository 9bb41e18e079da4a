"""GPM (GPU Performance Monitoring, NVML on Hopper and newer): what the SMs, tensor cores, DRAM and links really did.

NVML's utilization is the share of time any kernel ran: one small kernel on a few SMs reads 100%. GPM's metrics say
how much of the GPU worked: the share of SMs busy, of warps resident, of time the tensor cores ran, of DRAM bandwidth
used, and the PCIe and NVLink traffic. A GPM sample is a snapshot of the GPU's counters; nvmlGpmMetricsGet turns a
pair of them into each metric's mean over the time between. The exporter keeps two sample buffers per GPU and takes
one sample each GPM period (`--gpm-interval`, a scrape's worth: 5 s), so each period's metrics come from its own pair
(the previous period's sample and this one's): two calls per GPU per period, on the sampler's thread, none at a
scrape; the samples between serve the last period's means. GPM reads counters of its own,
not the profiler's that DCGM's DCP metrics use, so it runs beside Nsight (NVIDIA/DCGM#62).

Units as NVML gives them (pynvml's NVML_GPM_METRIC_* comments, from nvml.h): utilization-type metrics in percent,
0.0-100.0, served as 0..1 ratios; throughput metrics in MiB/s, added up into byte counters (the mean rate times the
time between the pair), so that Prometheus' rate() over any window gives the traffic in it, whatever the scrape
interval, where a gauge of the last period's rate would show one second in fifteen.

Where GPM cannot answer (a GPU before Hopper, a MIG-mode GPU whose whole-GPU samples NVML refuses, a driver or
nvidia-ml-py older than GPM) its series are absent and the GPU's `reason` says why (catalog.GPU_GPM_INFO); the call
that said so is counted like every failing NVML call.

Every call goes through the exporter's NvmlSession (monitoring/exporter/nvml.py, which imports this module), where
failures are counted and unsupported calls remembered: `session` and `gpu` below are its NvmlSession and Gpu.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# NVML's GPM metric ids (nvml.h's nvmlGpmMetricId_t), written out as nvml.py writes its constants.
SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL = 2, 3, 5, 10
PCIE_TX_PER_SEC, PCIE_RX_PER_SEC = 20, 21
NVLINK_TOTAL_RX_PER_SEC, NVLINK_TOTAL_TX_PER_SEC = 60, 61
METRICS_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION
MIB = 1 << 20

# Percent metrics: id -> the GpuSample attribute they are served as, a share.
RATIOS = {
    SM_UTIL: "sm_active_ratio",
    SM_OCCUPANCY: "sm_occupancy_ratio",
    ANY_TENSOR_UTIL: "tensor_active_ratio",
    DRAM_BW_UTIL: "dram_active_ratio",
}
# MiB/s metrics: id -> the GpuSample attribute of the byte counter they add up into.
RATES = {
    PCIE_TX_PER_SEC: "gpm_pcie_transmit_bytes",
    PCIE_RX_PER_SEC: "gpm_pcie_receive_bytes",
    NVLINK_TOTAL_TX_PER_SEC: "gpm_nvlink_transmit_bytes",
    NVLINK_TOTAL_RX_PER_SEC: "gpm_nvlink_receive_bytes",
}
METRIC_NAMES = {
    SM_UTIL: "NVML_GPM_METRIC_SM_UTIL",
    SM_OCCUPANCY: "NVML_GPM_METRIC_SM_OCCUPANCY",
    ANY_TENSOR_UTIL: "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    DRAM_BW_UTIL: "NVML_GPM_METRIC_DRAM_BW_UTIL",
    PCIE_TX_PER_SEC: "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    PCIE_RX_PER_SEC: "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    NVLINK_TOTAL_TX_PER_SEC: "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
    NVLINK_TOTAL_RX_PER_SEC: "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
}
NO_GPM_ON_GPU = "the GPU has no GPM (Hopper and newer have it)"
NO_GPM_IN_PYNVML = "nvidia-ml-py without GPM (12.535 or newer has it)"


@dataclass
class Gpm:
    """One GPU's GPM: whether it answers, and the state a pair of samples needs between reads."""

    supported: bool
    reason: str = ""
    period: float = 0.0
    """The least time between two samples; 0 takes one at each read."""
    latest: dict[str, float] = field(default_factory=dict)
    """Ratio attribute -> the last pair's mean, served until the next pair closes."""
    """Why not, where not: the call and NVML's error, or that the GPU has no GPM."""
    samples: list = field(default_factory=list)
    """Two sample buffers: [previous, next]; the next sample is taken into the second, then they swap."""
    previous_at: float | None = None
    """When the previous sample was taken; None where there is none to pair with (the first, or one that failed)."""
    totals: dict[str, float] = field(default_factory=dict)
    """Byte counter attribute -> bytes since the exporter started, from the first pair that answered it."""
    unsupported_metrics: set[int] = field(default_factory=set)
    request: Any = None  # pynvml's c_nvmlGpmMetricsGet_t: its module has no type information
    """The nvmlGpmMetricsGet request, built once and rebuilt only when a metric drops out: pynvml's structures
    answer each attribute through Python, so building one per period would cost more than the call."""
    wanted: tuple[int, ...] = ()
    """The metric ids in the request, in its order."""


def start(session, gpu, period: float = 0.0) -> Gpm:
    """Whether the GPU has GPM, and its two sample buffers where it has; a sample every `period` seconds."""
    if not hasattr(session.nvml, "c_nvmlGpmMetricsGet_t"):
        return Gpm(False, NO_GPM_IN_PYNVML)
    support = session.ask(gpu, "nvmlGpmQueryDeviceSupport")
    if support is None:
        return Gpm(False, f"nvmlGpmQueryDeviceSupport: {session.last_error}")
    if not support.isSupportedDevice:
        return Gpm(False, NO_GPM_ON_GPU)
    samples = [session.ask(None, "nvmlGpmSampleAlloc") for _ in range(2)]
    if None in samples:
        reason = f"nvmlGpmSampleAlloc: {session.last_error}"
        _free(session, [s for s in samples if s is not None])
        return Gpm(False, reason)
    return Gpm(True, period=period, samples=samples)


def read(session, gpu, state: Gpm, sample, now: float) -> None:
    """Take this period's sample and put the metrics of the pair it closes into `sample`."""
    if not state.supported:
        return
    # A tenth of the period early still samples: the sampler's ticks jitter around a whole number of intervals.
    if state.previous_at is not None and now - state.previous_at < 0.9 * state.period:
        _serve(state, sample)
        return
    taken = session.ask(gpu, "nvmlGpmSampleGet", state.samples[1])
    if taken is None:
        if ("nvmlGpmSampleGet",) in gpu.unsupported:  # for the whole GPU: MIG mode
            state.supported, state.reason = False, f"nvmlGpmSampleGet: {session.last_error}"
            stop(session, state)
        state.previous_at, state.latest = None, {}  # a failed sample starts no period and ends the last one's
        return
    if state.previous_at is not None:
        elapsed, state.latest = now - state.previous_at, {}
        for metric, value in _metrics(session, state).items():
            if metric in RATIOS:
                state.latest[RATIOS[metric]] = value / 100
            else:
                state.totals[RATES[metric]] = state.totals.get(RATES[metric], 0.0) + value * MIB * elapsed
    state.samples.reverse()
    state.previous_at = now
    _serve(state, sample)


def _serve(state: Gpm, sample) -> None:
    for attribute, value in (*state.latest.items(), *state.totals.items()):
        setattr(sample, attribute, value)


def _metrics(session, state: Gpm) -> dict[int, float]:
    """The metrics of the pair [previous, the one just taken] in one call; each metric has its own return code,
    handled like a call of its own (a metric the GPU lacks, such as NVLink on a PCIe card, is asked once)."""
    wanted = tuple(m for m in METRIC_NAMES if m not in state.unsupported_metrics)
    if not wanted:
        return {}
    if wanted != state.wanted:
        state.request, state.wanted = session.nvml.c_nvmlGpmMetricsGet_t(), wanted
        state.request.version, state.request.numMetrics = METRICS_GET_VERSION, len(wanted)
        for slot, metric in zip(state.request.metrics, wanted, strict=False):  # the struct holds every id
            slot.metricId = metric
    state.request.sample1, state.request.sample2 = state.samples
    answer = session.ask(None, "nvmlGpmMetricsGet", state.request)
    values = {}
    for metric, slot in zip(wanted, answer.metrics if answer is not None else (), strict=False):
        code = slot.nvmlReturn
        if code == 0:
            values[metric] = slot.value
        elif session.item_failed(f"nvmlGpmMetricsGet/{METRIC_NAMES[metric]}", code):
            state.unsupported_metrics.add(metric)
    return values


def stop(session, state: Gpm) -> None:
    _free(session, state.samples)
    state.samples = []


def _free(session, samples: list) -> None:
    for sample in samples:
        session.ask(None, "nvmlGpmSampleFree", sample)
