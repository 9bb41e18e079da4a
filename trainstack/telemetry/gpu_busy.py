"""How busy a rank's own GPU was over a log interval: the share of NVML's utilization samples' time a kernel ran.

The driver samples each GPU's utilization on its own, every fraction of a second, and keeps the recent samples with
their times (microseconds, on the host's clock). `nvmlDeviceGetSamples` hands over those taken since a given
time, so one call at the end of each log interval reads the interval's samples: nothing is read per step. The
samples taken while the loop did not step (startup, a pause, a step that compiled) are left out, since the
interval's step time leaves that time out too. The driver keeps only its most recent samples, so over a long
interval the share comes from the interval's latest part.

A utilization sample is the share of its period in which any kernel ran (not SM occupancy): that is the measure
wanted here, the time the device had nothing to run at all.
"""

from __future__ import annotations

import statistics

# nvmlValueType_t -> the field of c_nvmlValue_t that holds a sample of that type.
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
MICROSECONDS = 1e6


class GpuBusy:
    def __init__(self, nvml, handle):
        self._nvml = nvml
        self._handle = handle
        self._read_up_to = 0  # microseconds: the samples after this are not read yet

    @classmethod
    def open(cls, uuid: str) -> GpuBusy | None:
        """None where NVML cannot answer for this GPU (no driver library, a MIG instance, an older driver): its
        host-bound idle is then not measured."""
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        try:
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid))
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            return None

    def share(self, start: float, end: float, not_stepping: list[tuple[float, float]]) -> float | None:
        """The mean utilization of the samples taken between `start` and `end` (unix seconds) outside the
        `not_stepping` spans, as a share; None when there is no such sample (an interval shorter than the driver's
        sampling period) or NVML did not answer."""
        nvml, since = self._nvml, self._read_up_to
        self._read_up_to = int(end * MICROSECONDS)
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, since)
        except nvml.NVMLError:  # NotFound: no sample since the last read
            return None

        def stepping(stamp: int) -> bool:
            return start * MICROSECONDS <= stamp <= end * MICROSECONDS and not any(
                a * MICROSECONDS <= stamp <= b * MICROSECONDS for a, b in not_stepping
            )

        values = [getattr(s.sampleValue, VALUE_FIELDS[value_type]) for s in samples if stepping(s.timeStamp)]
        return statistics.fmean(values) / 100 if values else None

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
