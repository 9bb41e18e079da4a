"""The fake's GPM (GPU Performance Monitoring, Hopper and newer): nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc,
nvmlGpmSampleGet, nvmlGpmSampleFree and nvmlGpmMetricsGet, answering as pynvml's do.

A GPU model's "gpm" answers the metrics in NVML's own units, keyed by the metric's NVML name: utilization-type
metrics in percent (0.0-100.0), throughput metrics in MiB/s (pynvml's NVML_GPM_METRIC_* comments, from nvml.h).
A model without "gpm" is a GPU without GPM (Ampere and older): nvmlGpmQueryDeviceSupport answers
isSupportedDevice=0 and nvmlGpmSampleGet raises NVMLError_NotSupported, as NVML does there. "gpm" may instead be an
error name ("NVMLError_NotSupported": a MIG-mode GPU, whose whole-GPU samples NVML refuses), and a single metric's
value an error name too (its own nvmlReturn in the answer). A host's "missing_functions" can hold the GPM calls (a
driver older than GPM: FunctionNotFound).

Real GPM samples are snapshots of the GPU's counters, and nvmlGpmMetricsGet divides their difference by the time
between them. The fake holds each metric steady between the moments a test sets it (a host file's overrides, or
`set_gpm()` in-process): a sample records the values in force when it was taken, and a pair answers those of its
second sample, the mean over a period in which they held.
"""

from __future__ import annotations

import ctypes
import itertools
from types import SimpleNamespace

import pynvml as _real

c_nvmlGpmSample_t = _real.c_nvmlGpmSample_t
c_nvmlGpmMetricsGet_t = _real.c_nvmlGpmMetricsGet_t
c_nvmlGpmSupport_t = _real.c_nvmlGpmSupport_t
NVML_GPM_METRICS_GET_VERSION = _real.NVML_GPM_METRICS_GET_VERSION
NVML_GPM_SUPPORT_VERSION = _real.NVML_GPM_SUPPORT_VERSION

_METRIC_NAMES = {getattr(_real, name): name for name in dir(_real) if name.startswith("NVML_GPM_METRIC_")}
_addresses = itertools.count(0x7000)
_samples: dict[int, dict | None] = {}
"""Address of each allocated sample -> what it holds: None until nvmlGpmSampleGet fills it."""
_fake = SimpleNamespace()
"""The fake's own helpers (how every call is entered, answered and fails), handed over by the package with `bind`:
the package imports this module, so this one cannot import the package."""


# What the package serves as pynvml's names.
API = (
    "c_nvmlGpmSample_t",
    "c_nvmlGpmMetricsGet_t",
    "c_nvmlGpmSupport_t",
    "NVML_GPM_METRICS_GET_VERSION",
    "NVML_GPM_SUPPORT_VERSION",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "set_gpm",
)


def bind(**helpers) -> None:
    vars(_fake).update(helpers)


def set_gpm(index: int, metrics: dict[str, float | str] | str) -> None:
    """GPU `index`'s GPM metrics from now on, merged into its model's: metric name -> value in NVML's units (or an
    error name); or one error name for the whole GPU."""
    gpu = _fake.require_host().gpus[index]
    if isinstance(metrics, str) or not isinstance(gpu.answers.get("gpm"), dict):
        gpu.answers["gpm"] = metrics if isinstance(metrics, str) else dict(metrics)
    else:
        gpu.answers["gpm"] = {**gpu.answers["gpm"], **metrics}


def nvmlGpmQueryDeviceSupport(handle):
    gpu = _fake.enter("nvmlGpmQueryDeviceSupport", handle)
    support = c_nvmlGpmSupport_t(version=NVML_GPM_SUPPORT_VERSION)
    support.isSupportedDevice = int("gpm" in gpu.answers)  # a MIG-mode GPU has GPM, but not for the whole GPU
    return support


def nvmlGpmSampleAlloc():
    _fake.enter("nvmlGpmSampleAlloc")
    address = next(_addresses)
    _samples[address] = None
    return ctypes.cast(ctypes.c_void_p(address), c_nvmlGpmSample_t)


def _address(sample) -> int:
    address = ctypes.cast(sample, ctypes.c_void_p).value
    if address not in _samples:
        raise _fake.error("InvalidArgument")
    return address


def nvmlGpmSampleFree(sample) -> None:
    _fake.enter("nvmlGpmSampleFree")
    del _samples[_address(sample)]


def nvmlGpmSampleGet(handle, sample):
    gpu = _fake.enter("nvmlGpmSampleGet", handle)
    metrics = _fake.answer(gpu, "gpm")  # raises the GPU's error: NotSupported without GPM
    _samples[_address(sample)] = {"gpu": gpu.index, "values": dict(metrics)}
    return sample


def nvmlGpmMetricsGet(metrics_get):
    _fake.enter("nvmlGpmMetricsGet")
    if metrics_get.version != NVML_GPM_METRICS_GET_VERSION:
        raise _fake.error("ArgumentVersionMismatch")
    first, second = (_samples.get(_address(s)) for s in (metrics_get.sample1, metrics_get.sample2))
    if first is None or second is None or first["gpu"] != second["gpu"]:
        raise _fake.error("InvalidArgument")
    answers = second["values"]
    # ctypes.Structure's own attribute access: pynvml's structures route each through Python, which would make the
    # fake's bookkeeping, not the modelled cost, most of what the call costs
    slots = c_nvmlGpmMetricsGet_t.metrics.__get__(metrics_get)  # the fields' own descriptors
    for index in range(c_nvmlGpmMetricsGet_t.numMetrics.__get__(metrics_get)):
        metric = slots[index]
        answer = answers.get(
            _METRIC_NAMES.get(ctypes.Structure.__getattribute__(metric, "metricId")), "NVMLError_NotSupported"
        )
        if isinstance(answer, str):
            ctypes.Structure.__setattr__(metric, "nvmlReturn", _fake.error(answer).value)
        else:
            ctypes.Structure.__setattr__(metric, "value", float(answer))
            ctypes.Structure.__setattr__(metric, "nvmlReturn", _real.NVML_SUCCESS)
    return metrics_get
