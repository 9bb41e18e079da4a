"""NVML access for the exporter: one session per process (nvmlInit once), one GpuSample per GPU per read.

Every NVML call goes through `NvmlSession._ask`, where the rules live: a call a GPU does not support is remembered
and never made again (its field is omitted, never a sentinel), every failure is counted by call and error, a GPU
that answers NVMLError_GpuIsLost drops out for good, and nothing raises to the caller, so no NVML failure can fail
a read. What cannot change while the exporter runs (name, UUID, PCI bus, maximum clocks, how many NVLinks) is read
once.

A read has two parts, priced from a real driver (H100, driver 580; docs/metrics.md has the table). The fast part is
the calls that cost 1-7 us each (utilization, memory, temperature, clocks, clock events, power, processes) and is
read every sample. The slow part is the counters and slow sensors NVML offers as fields, in one
nvmlDeviceGetFieldValues call per GPU: that call costs about 5 ms, 4.3 ms of it the energy counter alone, so
monitoring/exporter/sampler.py reads it at a slower cadence. The GPU's links (PCIe generation and width, NVLinks
active: microseconds a call) are read with the slow part, as they seldom change. Power is read with
nvmlDeviceGetPowerUsage rather than the field NVML_FI_DEV_POWER_AVERAGE: where the GPU has that field the call
answers the same 1 s average (NVML's documentation: Ampere except GA100, and newer), and it keeps the fast part free
of the field-values call, whose own price (~0.12 ms) would be most of a fast read.

Every process NVML lists on a GPU (its compute and graphics lists) is read with its memory there, so a job that
is no trainstack run still shows which process drives which GPUs (one process on several GPUs is nn.DataParallel's
shape: monitoring/diagnose). A process's name is asked once, when it first appears (nvmlSystemGetProcessName: the
name nvidia-smi shows), and is empty where this exporter's PID namespace does not see the process.

On Hopper and newer each sample also takes one GPM sample per GPU, whose pair with the previous one gives the
SMs', tensor cores' and links' mean activity over the period (monitoring/exporter/gpm.py).

GPUs are read one after the other on the sampler's thread, never in a scrape: a slow read cannot hold up a
scrape, and one thread spends the least CPU.
"""

from __future__ import annotations

import ctypes
import posixpath
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType

from trainstack.monitoring.exporter import gpm as gpm_metrics

# NVML's stable ABI values, written out so the exporter does not depend on how new the installed pynvml is.
TEMPERATURE_GPU = 0
CLOCK_SM, CLOCK_MEM = 1, 2
PERF_POLICY_POWER, PERF_POLICY_THERMAL = 0, 1
PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES = 0, 1
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
FEATURE_ENABLED = 1
MEMORY_INFO_V2 = 0x02000028  # pynvml.nvmlMemory_v2: the version of nvmlMemory_v2_t, which adds `reserved`
SCOPE_ALL_LINKS = 0xFFFFFFFF  # field scope UINT_MAX: "summed over all NVLinks" (nvml.h)

FI_ECC_SBE_VOL_TOTAL, FI_ECC_DBE_VOL_TOTAL = 3, 4
FI_PERF_POLICY_POWER, FI_PERF_POLICY_THERMAL = 74, 75
FI_MEMORY_TEMP, FI_TOTAL_ENERGY_CONSUMPTION = 82, 83
FI_NVLINK_LINK_COUNT, FI_PCIE_REPLAY_COUNTER = 91, 94
FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX = 138, 139
FI_POWER_CURRENT_LIMIT = 190

# The slow part of a read: counters and slow sensors read with one nvmlDeviceGetFieldValues call per GPU instead of
# one call each: field id -> (GpuSample attribute, factor to base units).
FIELD_TARGETS = {
    FI_POWER_CURRENT_LIMIT: ("power_limit_watts", 1e-3),  # mW, the limit enforced, whoever set it
    FI_PERF_POLICY_POWER: ("power_violation_seconds", 1e-9),  # ns
    FI_PERF_POLICY_THERMAL: ("thermal_violation_seconds", 1e-9),
    FI_MEMORY_TEMP: ("memory_temperature_celsius", 1.0),
    FI_TOTAL_ENERGY_CONSUMPTION: ("energy_joules", 1e-3),  # mJ since the driver loaded
    FI_PCIE_REPLAY_COUNTER: ("pcie_replays", 1.0),
    FI_ECC_SBE_VOL_TOTAL: ("ecc_corrected_errors", 1.0),
    FI_ECC_DBE_VOL_TOTAL: ("ecc_uncorrected_errors", 1.0),
    FI_NVLINK_THROUGHPUT_DATA_TX: ("nvlink_transmit_bytes", 1024.0),  # KiB
    FI_NVLINK_THROUGHPUT_DATA_RX: ("nvlink_receive_bytes", 1024.0),
}
# The GPU's links, read with the slow part: they rarely change, but a PCIe link can train down to a lower width or
# generation while the exporter runs. GpuSample attribute -> the call that answers it.
PCIE_LINK_CALLS = {
    "pcie_generation": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_max_generation": "nvmlDeviceGetMaxPcieLinkGeneration",  # the most this GPU and its slot allow
    "pcie_max_width": "nvmlDeviceGetMaxPcieLinkWidth",
}
LINK_ATTRIBUTES = (*PCIE_LINK_CALLS, "nvlinks_active")
# GpuSample attributes of the slow part: a sample read without it has None there.
SLOW_ATTRIBUTES = frozenset(attribute for attribute, _ in FIELD_TARGETS.values()) | frozenset(LINK_ATTRIBUTES)
# Where a GPU or driver lacks one of these fields, the call that answers the same value, asked on its own instead:
# drivers older than a field do not know it, and some drivers have no nvmlDeviceGetFieldValues at all.
FALLBACK_CALLS = {
    FI_POWER_CURRENT_LIMIT: ("nvmlDeviceGetEnforcedPowerLimit", ()),
    FI_PERF_POLICY_POWER: ("nvmlDeviceGetViolationStatus", (PERF_POLICY_POWER,)),
    FI_PERF_POLICY_THERMAL: ("nvmlDeviceGetViolationStatus", (PERF_POLICY_THERMAL,)),
}
FIELD_NAMES = {
    FI_PERF_POLICY_POWER: "NVML_FI_DEV_PERF_POLICY_POWER",
    FI_PERF_POLICY_THERMAL: "NVML_FI_DEV_PERF_POLICY_THERMAL",
    FI_POWER_CURRENT_LIMIT: "NVML_FI_DEV_POWER_CURRENT_LIMIT",
    FI_ECC_SBE_VOL_TOTAL: "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    FI_ECC_DBE_VOL_TOTAL: "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    FI_MEMORY_TEMP: "NVML_FI_DEV_MEMORY_TEMP",
    FI_TOTAL_ENERGY_CONSUMPTION: "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    FI_NVLINK_LINK_COUNT: "NVML_FI_DEV_NVLINK_LINK_COUNT",
    FI_PCIE_REPLAY_COUNTER: "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    FI_NVLINK_THROUGHPUT_DATA_TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    FI_NVLINK_THROUGHPUT_DATA_RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
}
# nvmlValue_t member for each NVML_VALUE_TYPE_*.
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Answers that say "this GPU or driver has no such thing": static, so asked once and then omitted.
UNSUPPORTED_ERRORS = {"NotSupported", "FunctionNotFound"}
# A field's own answer can also be InvalidArgument: a field id newer than the driver, or a scope the GPU lacks.
UNSUPPORTED_FIELD_ERRORS = UNSUPPORTED_ERRORS | {"InvalidArgument"}
MAX_EVENTS_PER_READ = 1000
# The process lists of a GPU, each newest API first: R470 drivers lack the v3 calls pynvml's unversioned names make.
PROCESS_LISTS: tuple[tuple[tuple[str, tuple[()], dict[str, object]], ...], ...] = tuple(
    ((f"nvmlDeviceGet{kind}RunningProcesses", (), {}), (f"nvmlDeviceGet{kind}RunningProcesses_v2", (), {}))
    for kind in ("Compute", "Graphics")
)


@dataclass
class GpuSample:
    """One GPU at one moment, in base units. None: the GPU does not support the field or the call failed."""

    index: int
    uuid: str
    utilization_ratio: float | None = None
    memory_busy_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: int | None = None
    power_violation_seconds: float | None = None
    thermal_violation_seconds: float | None = None
    pcie_replays: float | None = None
    ecc_corrected_errors: float | None = None
    ecc_uncorrected_errors: float | None = None
    nvlink_transmit_bytes: float | None = None
    nvlink_receive_bytes: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    nvlinks_active: int | None = None
    """None on a GPU without NVLink; 0 on one whose links no bridge or switch connects."""
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    sm_active_ratio: float | None = None
    """GPM (monitoring/exporter/gpm.py): means over the sampling period; None without GPM or before its second
    sample."""
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    gpm_pcie_transmit_bytes: float | None = None
    """GPM's link traffic, added up since the exporter started."""
    gpm_pcie_receive_bytes: float | None = None
    gpm_nvlink_transmit_bytes: float | None = None
    gpm_nvlink_receive_bytes: float | None = None
    process_memory_bytes: dict[int, float] = field(default_factory=dict)
    """pid -> device memory it uses on this GPU, for every process NVML lists there with a known figure."""


@dataclass
class Gpu:
    """What NVML says about a GPU that cannot change while the exporter runs, read once."""

    index: int
    handle: object
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    nvlinks: int | None = None
    """How many NVLinks the GPU has (NVML_FI_DEV_NVLINK_LINK_COUNT); None on a GPU without NVLink."""
    field_requests: tuple[tuple[int, int], ...] = ()
    unsupported: set[tuple] = field(default_factory=set)
    lost: bool = False
    gpm: gpm_metrics.Gpm | None = None
    """Whether the GPU answers GPM, or why not, and its samples (monitoring/exporter/gpm.py)."""


@dataclass
class NvmlReading:
    up: bool
    driver_version: str
    gpus: list[Gpu]
    samples: list[GpuSample]
    xid_errors: dict[tuple[int, str, int], int]
    """(gpu index, uuid, xid) -> count since the exporter started; kept after a GPU is lost."""
    process_names: dict[int, str] = field(default_factory=dict)
    """pid -> its name, for every pid in the samples; "" where NVML cannot tell."""


@dataclass
class NvmlHealth:
    up: bool
    gpus: int
    gpus_lost: int
    errors: dict[tuple[str, str], int]
    """(call, error) -> count since the exporter started."""


class _GpuLost(Exception):
    pass


def error_name(error: Exception) -> str:
    """NVMLError_NotSupported -> "NotSupported"; pynvml's wrapper for a missing symbol counts as FunctionNotFound."""
    name = type(error).__name__
    if name == "NVMLLibraryMismatchError":
        return "FunctionNotFound"
    if name == "NVMLError":
        return f"code_{getattr(error, 'value', 'unknown')}"
    return name.removeprefix("NVMLError_")


def _address(handle) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


class NvmlSession:
    """Owns NVML for the process: init once at construction, `read()` per sample, `close()` at exit. Thread-safe:
    reads are one at a time, and `health()` never waits for a read (a hung NVML call must not hang a scrape)."""

    def __init__(self, nvml: ModuleType, pcie_throughput: bool = False, gpm_interval_seconds: float = 0.0):
        """`gpm_interval_seconds`: the least time between GPM samples (0: one each read)."""
        self._nvml = nvml
        self._pcie_throughput = pcie_throughput
        self._gpm_interval = gpm_interval_seconds
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._xid_errors: Counter[tuple[int, str, int]] = Counter()
        self._unsupported: set[tuple] = set()
        self._gpus: list[Gpu] = []
        self._gpus_by_address: dict[int | None, Gpu] = {}
        self._process_names: dict[int, str] = {}
        self._events = None
        self.up = False
        self.down_reason = ""
        self.driver_version = ""
        self.clock = time.monotonic
        """When a GPM sample is taken: its byte counters add each pair's mean rate times the time between them."""
        self.last_error = ""
        """The error name of the latest call that failed, for a caller that says why a feature is off (GPM)."""
        with self._lock:
            self._start()

    # --- the one place NVML is called ---------------------------------------------------------------------------

    @property
    def nvml(self) -> ModuleType:
        return self._nvml

    def ask(self, gpu: Gpu | None, call: str, *args, **kwargs):
        """`_ask` for the modules that read a part of NVML for this session (gpm.py), under its read lock."""
        return self._ask(gpu, call, *args, **kwargs)

    def item_failed(self, call: str, code: int) -> bool:
        """One item of a call that answers several, each with its own return code, failed: counted as `call`;
        True where the code says the GPU or driver lacks the item (asked once, then omitted)."""
        name = error_name(self._nvml.NVMLError(code))
        self._count(call, name)
        return name in UNSUPPORTED_FIELD_ERRORS

    def _count(self, call: str, error: str) -> None:
        with self._count_lock:  # health() copies the counts from a scrape's thread
            self._errors[(call, error)] += 1

    def _ask(self, gpu: Gpu | None, call: str, *args, **kwargs):
        """One NVML call (on `gpu`'s handle when given). Returns None when it failed or is unsupported."""
        key = _call_key(call, args, kwargs) if args or kwargs else (call,)  # most calls take only the handle
        unsupported = gpu.unsupported if gpu is not None else self._unsupported
        if key in unsupported:
            return None
        function = getattr(self._nvml, call, None)
        try:
            if function is None:  # an older nvidia-ml-py without this name
                raise self._nvml.NVMLError_FunctionNotFound()
            return function(*((gpu.handle,) if gpu is not None else ()), *args, **kwargs)
        except Exception as error:  # whatever NVML raises, the scrape goes on
            name = error_name(error)
            self._count(call, name)
            self.last_error = name
            if name in UNSUPPORTED_ERRORS:
                unsupported.add(key)
            elif name == "GpuIsLost" and gpu is not None:
                raise _GpuLost() from error
            return None

    def _ask_first(self, gpu: Gpu, *alternatives: tuple):
        """The newest API the driver has: each (call, args, kwargs) is tried only while the ones before it are
        unsupported; a transient failure of a supported call is not a reason to fall back."""
        for call, args, kwargs in alternatives:
            answer = self._ask(gpu, call, *args, **kwargs)
            if answer is not None or _call_key(call, args, kwargs) not in gpu.unsupported:
                return answer
        return None

    def _field_values(self, gpu: Gpu, requests: tuple[tuple[int, int], ...]) -> dict[int, float]:
        """Several counters in one call; each field has its own return code, handled like a call of its own."""
        requests = tuple(r for r in requests if ("field", *r) not in gpu.unsupported)
        if not requests:
            return {}
        answers = self._ask(gpu, "nvmlDeviceGetFieldValues", requests)
        if answers is None and ("nvmlDeviceGetFieldValues",) in gpu.unsupported:  # so each field's fallback runs
            gpu.unsupported.update(("field", *request) for request in requests)
        values = {}
        for answer in answers or ():
            if answer.nvmlReturn == 0:
                values[answer.fieldId] = getattr(answer.value, VALUE_MEMBERS[answer.valueType])
                continue
            name = error_name(self._nvml.NVMLError(answer.nvmlReturn))
            self._count(f"nvmlDeviceGetFieldValues/{FIELD_NAMES.get(answer.fieldId, answer.fieldId)}", name)
            if name in UNSUPPORTED_FIELD_ERRORS:
                gpu.unsupported.add(("field", answer.fieldId, answer.scopeId))
            elif name == "GpuIsLost":
                raise _GpuLost()
        return values

    # --- once, at start ---------------------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._nvml.nvmlInit()
        except Exception as error:  # no driver is a normal state on a CPU host
            self._count("nvmlInit", error_name(error))
            self.down_reason = f"{error_name(error)}: {error}"
            return
        self.driver_version = self._ask(None, "nvmlSystemGetDriverVersion") or ""
        count = self._ask(None, "nvmlDeviceGetCount")
        if count is None:
            self.down_reason = "nvmlDeviceGetCount failed"
            return
        self.up = True
        self._events = self._ask(None, "nvmlEventSetCreate")
        for index in range(count):
            handle = self._ask(None, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            gpu = Gpu(index, handle)
            try:
                self._describe(gpu)
            except _GpuLost:
                gpu.lost = True
            if gpu.uuid or gpu.lost:
                self._gpus.append(gpu)
                self._gpus_by_address[_address(handle)] = gpu

    def _describe(self, gpu: Gpu) -> None:
        gpu.uuid = self._ask(gpu, "nvmlDeviceGetUUID") or ""
        gpu.name = self._ask(gpu, "nvmlDeviceGetName") or ""
        pci = self._ask(gpu, "nvmlDeviceGetPciInfo")
        if pci is not None:
            gpu.pci_bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        sm_max = self._ask(gpu, "nvmlDeviceGetMaxClockInfo", CLOCK_SM)
        memory_max = self._ask(gpu, "nvmlDeviceGetMaxClockInfo", CLOCK_MEM)
        gpu.sm_clock_max_hertz = sm_max * 1e6 if sm_max is not None else None
        gpu.memory_clock_max_hertz = memory_max * 1e6 if memory_max is not None else None
        requests = [
            (FI_POWER_CURRENT_LIMIT, 0),
            (FI_PERF_POLICY_POWER, 0),
            (FI_PERF_POLICY_THERMAL, 0),
            (FI_MEMORY_TEMP, 0),
            (FI_TOTAL_ENERGY_CONSUMPTION, 0),
            (FI_PCIE_REPLAY_COUNTER, 0),
            (FI_ECC_SBE_VOL_TOTAL, 0),
            (FI_ECC_DBE_VOL_TOTAL, 0),
        ]
        links = self._field_values(gpu, ((FI_NVLINK_LINK_COUNT, 0),)).get(FI_NVLINK_LINK_COUNT)
        gpu.nvlinks = int(links) if links is not None else None
        if self._active_nvlinks(gpu):
            requests += [
                (FI_NVLINK_THROUGHPUT_DATA_TX, SCOPE_ALL_LINKS),
                (FI_NVLINK_THROUGHPUT_DATA_RX, SCOPE_ALL_LINKS),
            ]
        gpu.field_requests = tuple(requests)
        if self._events is not None:
            self._ask(gpu, "nvmlDeviceRegisterEvents", EVENT_TYPE_XID_CRITICAL_ERROR, self._events)
        gpu.gpm = gpm_metrics.start(self, gpu, self._gpm_interval)

    def _active_nvlinks(self, gpu: Gpu) -> int | None:
        # A PCIe card can report links that no bridge connects: only active ones mean the GPU has NVLink traffic.
        if gpu.nvlinks is None:
            return None
        return sum(self._ask(gpu, "nvmlDeviceGetNvLinkState", link) == FEATURE_ENABLED for link in range(gpu.nvlinks))

    # --- every sample ----------------------------------------------------------------------------------------

    def read(self, slow: bool = True) -> NvmlReading:
        """Sample every GPU still present. `slow`: read the slow part too (else its attributes, SLOW_ATTRIBUTES,
        are None)."""
        with self._lock:
            samples = []
            if self.up:
                self._poll_events()
                for gpu in self._gpus:
                    if not gpu.lost and (sample := self._sample_present(gpu, slow)) is not None:
                        samples.append(sample)
            names = self._names({pid for sample in samples for pid in sample.process_memory_bytes})
            return NvmlReading(
                self.up,
                self.driver_version,
                [g for g in self._gpus if not g.lost],
                samples,
                dict(self._xid_errors),
                names,
            )

    def health(self) -> NvmlHealth:
        with self._count_lock:
            errors = dict(self._errors)
        lost = sum(gpu.lost for gpu in self._gpus)
        return NvmlHealth(self.up, len(self._gpus) - lost, lost, errors)

    def _sample_present(self, gpu: Gpu, slow: bool) -> GpuSample | None:
        try:
            return self._sample(gpu, slow)
        except _GpuLost:
            gpu.lost = True
            return None

    def _sample(self, gpu: Gpu, slow: bool) -> GpuSample:
        sample = GpuSample(gpu.index, gpu.uuid)
        rates = self._ask(gpu, "nvmlDeviceGetUtilizationRates")
        if rates is not None:
            sample.utilization_ratio = rates.gpu / 100
            sample.memory_busy_ratio = rates.memory / 100
        memory = self._ask_first(
            gpu, ("nvmlDeviceGetMemoryInfo", (), {"version": MEMORY_INFO_V2}), ("nvmlDeviceGetMemoryInfo", (), {})
        )
        if memory is not None:
            sample.memory_total_bytes = memory.total
            sample.memory_used_bytes = memory.used
            sample.memory_reserved_bytes = getattr(memory, "reserved", None)
        sample.temperature_celsius = self._ask(gpu, "nvmlDeviceGetTemperature", TEMPERATURE_GPU)
        sample.sm_clock_hertz = _scaled(self._ask(gpu, "nvmlDeviceGetClockInfo", CLOCK_SM), 1e6)  # MHz
        sample.memory_clock_hertz = _scaled(self._ask(gpu, "nvmlDeviceGetClockInfo", CLOCK_MEM), 1e6)
        sample.clock_event_reasons = self._ask_first(
            gpu,
            ("nvmlDeviceGetCurrentClocksEventReasons", (), {}),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", (), {}),
        )
        sample.power_watts = _scaled(self._ask(gpu, "nvmlDeviceGetPowerUsage"), 1e-3)  # mW
        if gpu.gpm is not None:
            gpm_metrics.read(self, gpu, gpu.gpm, sample, self.clock())
        if slow:
            self._sample_slow(gpu, sample)
        if self._pcie_throughput:  # each call blocks ~20 ms while NVML measures
            sample.pcie_transmit_bytes_per_second = _scaled(
                self._ask(gpu, "nvmlDeviceGetPcieThroughput", PCIE_UTIL_TX_BYTES), 1024.0
            )  # KiB/s
            sample.pcie_receive_bytes_per_second = _scaled(
                self._ask(gpu, "nvmlDeviceGetPcieThroughput", PCIE_UTIL_RX_BYTES), 1024.0
            )
        for process_list in PROCESS_LISTS:
            # A process in both lists (a CUDA program that also draws) has one figure for the GPU: kept once.
            for process in self._ask_first(gpu, *process_list) or ():
                if process.usedGpuMemory is not None:  # None: not available (Windows WDDM)
                    sample.process_memory_bytes[process.pid] = process.usedGpuMemory
        return sample

    def _names(self, pids: set[int]) -> dict[int, str]:
        """pid -> the name of its command, asked once while the process stays on a GPU: NVML reads it from /proc,
        so a process outside this exporter's PID namespace has none (its failure is counted once, too)."""
        known: dict[int, str] = {}
        for pid in pids:
            name = self._process_names.get(pid)
            if name is None:
                answer = self._ask(None, "nvmlSystemGetProcessName", pid)
                name = posixpath.basename(answer) if answer else ""  # a path where it was started by one
            known[pid] = name
        self._process_names = known
        return known

    def _sample_slow(self, gpu: Gpu, sample: GpuSample) -> None:
        values = self._field_values(gpu, gpu.field_requests)
        for field_id, (call, args) in FALLBACK_CALLS.items():
            if ("field", field_id, 0) in gpu.unsupported:
                answer = self._ask(gpu, call, *args)
                if answer is not None:
                    values[field_id] = getattr(answer, "violationTime", answer)  # a violation status: its ns
        for field_id, value in values.items():
            attribute, factor = FIELD_TARGETS[field_id]
            setattr(sample, attribute, value * factor)
        for attribute, call in PCIE_LINK_CALLS.items():
            setattr(sample, attribute, self._ask(gpu, call))
        sample.nvlinks_active = self._active_nvlinks(gpu)

    def _poll_events(self) -> None:
        """Drain the Xid events queued since the last read, without waiting for new ones."""
        if self._events is None:
            return
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = self._nvml.nvmlEventSetWait(self._events, 0)
            except Exception as error:
                if error_name(error) != "Timeout":  # Timeout: the queue is empty
                    self._count("nvmlEventSetWait", error_name(error))
                return
            gpu = self._gpus_by_address.get(_address(event.device))
            if event.eventType & EVENT_TYPE_XID_CRITICAL_ERROR and gpu is not None:
                self._xid_errors[(gpu.index, gpu.uuid, int(event.eventData))] += 1

    def close(self, timeout: float = 5.0) -> None:
        """Shut NVML down, unless a read is stuck in the driver for `timeout` s: the process is exiting, and
        nvmlShutdown under a hung call could hang it too."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            if not self.up:
                return
            if self._events is not None:
                self._ask(None, "nvmlEventSetFree", self._events)
            for gpu in self._gpus:
                if gpu.gpm is not None:
                    gpm_metrics.stop(self, gpu.gpm)
            self._ask(None, "nvmlShutdown")
            self.up = False
        finally:
            self._lock.release()


def _call_key(call: str, args: tuple, kwargs: dict) -> tuple:
    """A call's identity for remembering that it is unsupported: its name and its enum arguments."""
    return (call, *(a for a in args if isinstance(a, int)), *sorted(kwargs.items()))


def _scaled(value, factor: float) -> float | None:
    return value * factor if value is not None else None
