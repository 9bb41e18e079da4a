"""What a rank's own GPU really did over a log interval: the mean share of its SMs busy and of time its tensor cores
ran, from NVML's GPM (Hopper and newer), beside the utilization gpu_busy.py reads.

A GPM sample is a snapshot of the GPU's counters; a pair of them gives each metric's mean over the time between. The
rank takes one sample when it opens the reader and one at the end of each log interval, so each interval's pair
covers it exactly: one call to take a sample and one to read the pair, per interval, nothing per step. The interval's
pauses (a checkpoint, an evaluation) are in that time too, as they are in NVML's utilization samples before they
are cut out. Where GPM cannot answer (a GPU before Hopper, a MIG instance, a driver or nvidia-ml-py without GPM) the
reader is not opened and the records carry no such fields: absent, never 0.
"""

from __future__ import annotations

import importlib

# NVML's GPM metric ids (nvml.h's nvmlGpmMetricId_t) -> the record field; NVML answers them in percent.
FIELDS = {2: "sm_active_ratio", 5: "tensor_active_ratio"}  # NVML_GPM_METRIC_SM_UTIL, _ANY_TENSOR_UTIL
METRICS_GET_VERSION = 1


class GpuActivity:
    def __init__(self, nvml, handle, samples: list):
        self._nvml = nvml
        self._handle = handle
        self._samples = samples  # [the interval's start (taken by `open`), the next]: swapped after each read
        self._started = True

    @classmethod
    def open(cls, uuid: str, nvml=None) -> GpuActivity | None:
        """None where GPM cannot answer for this GPU. `nvml`: pynvml, or a stand-in (tests)."""
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return None
        samples = []
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                raise nvml.NVMLError_NotSupported()
            samples = [nvml.nvmlGpmSampleAlloc() for _ in range(2)]
            nvml.nvmlGpmSampleGet(handle, samples[0])  # a MIG instance refuses here
        except (nvml.NVMLError, AttributeError):  # AttributeError: an nvidia-ml-py without GPM
            for sample in samples:
                nvml.nvmlGpmSampleFree(sample)
            nvml.nvmlShutdown()
            return None
        return cls(nvml, handle, samples)

    def _sample(self, sample) -> bool:
        try:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
            return True
        except self._nvml.NVMLError:
            return False

    def read(self) -> dict[str, float]:
        """The record fields for the interval since the last read (or the opening): {} where a sample failed."""
        ended = self._sample(self._samples[1])
        fields = self._pair() if ended and self._started else {}
        if ended:
            self._samples.reverse()
        self._started = ended
        return fields

    def _pair(self) -> dict[str, float]:
        request = self._nvml.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics = METRICS_GET_VERSION, len(FIELDS)
        request.sample1, request.sample2 = self._samples
        for slot, metric in zip(request.metrics, FIELDS, strict=False):  # the struct holds every metric id
            slot.metricId = metric
        try:
            answer = self._nvml.nvmlGpmMetricsGet(request)
        except self._nvml.NVMLError:
            return {}
        return {
            FIELDS[slot.metricId]: slot.value / 100
            for slot in answer.metrics[: len(FIELDS)]
            if slot.nvmlReturn == 0 and slot.metricId in FIELDS
        }

    def close(self) -> None:
        try:
            for sample in self._samples:
                self._nvml.nvmlGpmSampleFree(sample)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
