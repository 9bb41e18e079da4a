"""A stand-in for nvidia-ml-py's `pynvml`, so the exporter's production code runs with no GPU.

Same function names, the same exception classes (taken from the real `pynvml`, so `except NVMLError_NotSupported`
means the same thing) and the same return types (the real ctypes structures and handles), answering from JSON
data shaped like what NVML returns: `gpus/<model>.json` holds one GPU model's answers, keyed by NVML call and then by
the NVML constant passed to it; `hosts/<name>.json` puts GPUs of those models in a host with a driver version.

A host file's "processes" map a GPU index to the processes NVML lists on it: pid, used_gpu_memory (bytes), and
optionally the name NVML gives the process and its type ("C" compute, "G" graphics, "C+G"; "C" when absent).
An entry with "watched": true stands for the command a trainstack launcher runs beside the exporter (`trainstack
watch -- CMD`, `trainstack train`), so a script on the fake gets the verdicts for its own pid. The launcher starts
the exporter first and the command after it (and starts the exporter again should it end), so no variable it hands
the exporter can name the command's pid; it names itself instead, in TRAINSTACK_SUPERVISOR_PID, and the command is
the other process it started. Where that variable is set, the entry answers that process's pid and, as NVML does,
its argv[0] as its name; while the launcher has started no other process, or it has ended, the entry is not listed,
as NVML lists no process then. Where it is not set (the fake loaded by a test, an exporter started by hand), the
entry answers its own pid and name, as any entry does. The command's main process is what holds the GPUs for a
script run directly (`python train.py`); through a wrapper (a shell, torchrun) the entry names the wrapper.

A value in a data file is an NVML answer in NVML's own units (mW, mJ, MHz, ns, KiB), or the name of the error
the call raises on that GPU ("NVMLError_NotSupported"), or a counter {"start": N, "per_second": R} that rises
with wall time. With no host loaded the fake behaves like a machine without a driver: nvmlInit raises
NVMLError_LibraryNotFound.

What a call costs: a host file may carry a cost profile measured on a real driver ("costs": the default cost of a
call, costs of particular calls, and the cost of each field inside nvmlDeviceGetFieldValues on top of that call's
own; hosts/h100_driver580.json), and `set_delay()` or NVML_FAKE_DELAY_US replace the calls' costs (the fields'
stay). A cost is spent as the profile or the delay mode says: "sleep" (blocked, and calls on different GPUs
overlap, as with a driver that locks per GPU), "serial" (blocked, but one call at a time for the whole driver, as
with a driver-wide lock) or "spin" (on the CPU, counted in the calling thread's CPU time, so a busy machine does
not shorten it: what the real driver's costs are).

Driven in-process by `load()`, `lose_gpu()`, `raise_xid()`, `fail()`, `fail_randomly()`, `hang()` and
`set_delay()`, or, in another process, from the environment at import: NVML_FAKE_HOST (a host name or a JSON
path), NVML_FAKE_DELAY_US (how long every call takes: "100", or with overrides
"100,nvmlDeviceGetComputeRunningProcesses=500") and NVML_FAKE_DELAY_MODE (sleep, serial or spin).
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, overload

import pynvml as _real

from trainstack.rundir import SUPERVISOR_PID_ENV

if TYPE_CHECKING:
    import psutil

# The constants and exception classes of the real module, so code written against pynvml runs unchanged.
globals().update(
    {
        name: getattr(_real, name)
        for name in dir(_real)
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "nvmlEventType", "nvmlMemory_v"))
        or name in ("NVMLLibraryMismatchError", "nvmlFriendlyObject")
    }
)

DATA_DIR = Path(__file__).parent
_UINT_MAX = 0xFFFFFFFF
_PR_SET_TIMERSLACK = 29
_NVLINK_FIELDS = {
    _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    _real.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
    _real.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
}
# NVML's value type for each field the data files use (everything else is an unsigned long long).
_FIELD_VALUE_TYPES = {
    _real.NVML_FI_DEV_MEMORY_TEMP: (_real.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
    _real.NVML_FI_DEV_NVLINK_LINK_COUNT: (_real.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
    _real.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (_real.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
    _real.NVML_FI_DEV_POWER_AVERAGE: (_real.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
    _real.NVML_FI_DEV_POWER_CURRENT_LIMIT: (_real.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
}
_FIELD_NAMES = {getattr(_real, name): name for name in dir(_real) if name.startswith("NVML_FI_DEV_")}
# Fields that report what a call of their own reports: answered from that call's data, unless a model's "fields"
# answer them itself (e.g. "NVMLError_NotSupported" where the GPU has the call but not the field).
_FIELDS_FROM_CALLS = {
    _real.NVML_FI_DEV_POWER_AVERAGE: ("nvmlDeviceGetPowerUsage",),
    _real.NVML_FI_DEV_POWER_CURRENT_LIMIT: ("nvmlDeviceGetEnforcedPowerLimit",),
    _real.NVML_FI_DEV_PERF_POLICY_POWER: ("nvmlDeviceGetViolationStatus", "NVML_PERF_POLICY_POWER"),
    _real.NVML_FI_DEV_PERF_POLICY_THERMAL: ("nvmlDeviceGetViolationStatus", "NVML_PERF_POLICY_THERMAL"),
}


class _Gpu:
    def __init__(self, index: int, spec: dict, answers: dict):
        self.index = index
        self.uuid = spec["uuid"]
        self.pci_bus_id = spec["pci_bus_id"]
        self.answers = answers
        self.lost = False
        self.address = 0x1000 + index
        self.handle = ctypes.cast(ctypes.c_void_p(self.address), _real.c_nvmlDevice_t)


class _Host:
    def __init__(self, spec: dict):
        self.driver_version = spec["driver_version"]
        self.init_error = spec.get("init_error")
        self.missing_functions = set(spec.get("missing_functions", ()))
        self.missing_fields = {getattr(_real, name) for name in spec.get("missing_fields", ())}
        self.gpus = []
        for index, gpu_spec in enumerate(spec["gpus"]):
            answers = json.loads((DATA_DIR / "gpus" / f"{gpu_spec['model']}.json").read_text())
            _merge(answers, gpu_spec.get("overrides", {}))
            self.gpus.append(_Gpu(index, gpu_spec, answers))
        self.gpus_by_address = {gpu.address: gpu for gpu in self.gpus}
        self.processes = {int(index): procs for index, procs in spec.get("processes", {}).items()}
        self.watches = any(process.get("watched") for listed in self.processes.values() for process in listed)
        self.watched: psutil.Process | None = None  # the watched command, found at the first call that lists it
        self.started = time.monotonic()
        self.initialised = False
        self.event_sets: list[list] = []
        self.scheduled_xids = [dict(event) for event in spec.get("xid_events", ())]
        self.failures: list[dict] = []
        self.random_failures: tuple[float, random.Random, list[str]] | None = None
        costs = spec.get("costs", {})
        self.delay_seconds = costs.get("default_ms", 0.0) / 1e3
        self.delay_overrides: dict[str, float] = {call: ms / 1e3 for call, ms in costs.get("calls_ms", {}).items()}
        self.field_delays = {getattr(_real, name): ms / 1e3 for name, ms in costs.get("fields_ms", {}).items()}
        self.delay_mode = costs.get("mode", "sleep")
        self.hangs: dict[str, tuple[threading.Event, threading.Event]] = {}
        self.calls: Counter[str] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()


_host: _Host | None = None
_lock = threading.Lock()
_driver_lock = threading.Lock()


def _merge(base: dict, overrides: dict) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and "start" not in value:
            _merge(base[key], value)
        else:
            base[key] = value


# --- driving the fake -------------------------------------------------------------------------------------------


def load(host: str | Path | dict | None) -> None:
    """Install a host: a name from hosts/, a path to a JSON file, a dict of the same shape, or None (no driver)."""
    global _host
    if host is None:
        _host = None
        return
    if isinstance(host, dict):
        spec = copy.deepcopy(host)
    else:
        path = Path(host) if str(host).endswith(".json") else DATA_DIR / "hosts" / f"{host}.json"
        spec = json.loads(path.read_text())
    _host = _Host(spec)
    _check_mode(_host.delay_mode)


def lose_gpu(index: int) -> None:
    """The GPU falls off the bus: from now on every call on it raises NVMLError_GpuIsLost."""
    _require_host().gpus[index].lost = True


def raise_xid(index: int, xid: int) -> None:
    """The driver reports Xid `xid` on GPU `index` to every event set registered for critical Xid errors."""
    host = _require_host()
    gpu = host.gpus[index]
    for registered in host.event_sets:
        if gpu.index in registered[0]:
            registered[1].append((gpu.handle, xid))


def fail(call: str, error: str, gpu: int | None = None, times: int = 1) -> None:
    """The next `times` calls of `call` (on GPU `gpu`, or on any GPU) raise NVMLError_<error>."""
    _require_host().failures.append({"call": call, "error": error, "gpu": gpu, "times": times})


def fail_randomly(rate: float, errors: list[str], seed: int) -> None:
    """From now on each device call raises one of `errors` (NVMLError_<name>) with probability `rate`."""
    _require_host().random_failures = (rate, random.Random(seed), list(errors))


def hang(call: str) -> tuple[threading.Event, threading.Event]:
    """The next call of `call` blocks inside the fake, as a driver call that hangs: returns (entered, release);
    `entered` is set once a caller is blocked, and the call goes on when the test sets `release`."""
    entered, release = threading.Event(), threading.Event()
    _require_host().hangs[call] = (entered, release)
    return entered, release


def set_delay(seconds: float, overrides: dict[str, float] | None = None, mode: str = "sleep") -> None:
    """Every call takes `seconds` (`overrides`: call name -> seconds); `mode`: sleep, serial or spin (above)."""
    host = _require_host()
    host.delay_seconds, host.delay_overrides, host.delay_mode = seconds, dict(overrides or {}), mode
    _check_mode(mode)


def _check_mode(mode: str) -> None:
    if mode not in ("sleep", "serial", "spin"):
        raise ValueError(f"delay mode {mode!r}: use sleep, serial or spin")
    # Linux lets a sleep overrun by the thread's timer slack (50 us by default), which would add half a call to
    # every 100 us call; threads started from now on inherit the 1 ns slack set here.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0)


def _delay_from_environment(spec: str, mode: str) -> None:
    default, *overrides = spec.split(",")
    set_delay(
        float(default) / 1e6,
        {call: float(us) / 1e6 for call, us in (override.split("=") for override in overrides)},
        mode=mode,
    )


def call_counts() -> Counter[str]:
    """How many times each NVML function was called since the host was loaded."""
    return Counter(_require_host().calls)


def injected_failures() -> Counter[tuple[str, str]]:
    """(call, error name) -> how many failures `fail()` and `fail_randomly()` have raised."""
    return Counter(_require_host().injected)


def _require_host() -> _Host:
    if _host is None:
        raise RuntimeError("no fake host loaded: call trainstack.monitoring.nvml_fake.load(...) first")
    return _host


# --- what every call goes through -------------------------------------------------------------------------------


def _error(name: str) -> _real.NVMLError:
    return getattr(_real, f"NVMLError_{name.removeprefix('NVMLError_')}")()


@overload
def _enter(call: str) -> None: ...


@overload
def _enter(call: str, handle: object) -> _Gpu: ...


def _enter(call: str, handle=None) -> _Gpu | None:
    host = _host
    if host is None or not host.initialised:
        raise _error("Uninitialized")
    with _lock:
        host.calls[call] += 1
        hung = host.hangs.pop(call, None)
    if hung is not None:
        entered, release = hung
        entered.set()
        release.wait()
    _spend(host, host.delay_overrides.get(call, host.delay_seconds))
    if call in host.missing_functions:
        raise _error("FunctionNotFound")
    gpu = None
    if handle is not None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        gpu = host.gpus_by_address.get(address) if address is not None else None
        if gpu is None:
            raise _error("InvalidArgument")
        if gpu.lost:
            raise _error("GpuIsLost")
    with _lock:
        for failure in host.failures:
            if failure["call"] == call and failure["gpu"] in (None, gpu and gpu.index) and failure["times"] > 0:
                failure["times"] -= 1
                host.injected[(call, failure["error"])] += 1
                raise _error(failure["error"])
        if host.random_failures and gpu is not None:
            rate, rng, errors = host.random_failures
            if rng.random() < rate:
                error = rng.choice(errors)
                host.injected[(call, error)] += 1
                raise _error(error)
    return gpu


# Hashing a buffer this large releases the GIL, as the real driver's ctypes calls do: a spinning call keeps its
# core busy without holding up a scrape in another thread, which a pure-Python busy loop would.
_SPIN_BUFFER = bytes(16384)


def _spend(host: _Host, seconds: float) -> None:
    if seconds and host.delay_mode == "spin":
        end = time.thread_time() + seconds
        while end - time.thread_time() > 50e-6:
            hashlib.blake2b(_SPIN_BUFFER)  # ~20 us a hash: only the microseconds left spin holding the GIL
        while time.thread_time() < end:
            pass
    elif seconds and host.delay_mode == "serial":
        with _driver_lock:
            time.sleep(seconds)
    elif seconds:
        time.sleep(seconds)


def _value(spec):
    """Evaluate one data-file answer: an error name raises it, a counter is read now, anything else is returned."""
    if isinstance(spec, str) and spec.startswith("NVMLError_"):
        raise _error(spec)
    if isinstance(spec, dict) and "per_second" in spec:
        return int(spec["start"] + spec["per_second"] * (time.monotonic() - _require_host().started))
    return spec


def _answer(gpu: _Gpu, call: str, *keys: str):
    spec = gpu.answers.get(call, "NVMLError_NotSupported")
    for key in keys:
        spec = _value(spec)
        spec = spec.get(key, "NVMLError_NotSupported")
    return _value(spec)


def _answer_for(gpu: _Gpu, call: str, constant: int):
    """The answer to `call(handle, constant)`: the data file keys these answers by the constant's NVML name."""
    answers = _value(gpu.answers.get(call, "NVMLError_NotSupported"))
    name = next((name for name in answers if getattr(_real, name, None) == constant), None)
    if name is None:
        raise _error("InvalidArgument")
    return _value(answers[name])


# --- the NVML API ----------------------------------------------------------------------------------------------


def nvmlInit() -> None:
    host = _host
    if host is None:
        raise _error("LibraryNotFound")
    if host.init_error:
        raise _error(host.init_error)
    host.initialised = True


def nvmlShutdown() -> None:
    _enter("nvmlShutdown")
    _require_host().initialised = False


def nvmlSystemGetDriverVersion() -> str:
    _enter("nvmlSystemGetDriverVersion")
    return _require_host().driver_version


def nvmlDeviceGetCount() -> int:
    _enter("nvmlDeviceGetCount")
    return len(_require_host().gpus)


def nvmlDeviceGetHandleByIndex(index: int):
    _enter("nvmlDeviceGetHandleByIndex")
    gpus = _require_host().gpus
    if not 0 <= index < len(gpus):
        raise _error("InvalidArgument")
    if gpus[index].lost:
        raise _error("GpuIsLost")
    return gpus[index].handle


def nvmlDeviceGetUUID(handle) -> str:
    return _enter("nvmlDeviceGetUUID", handle).uuid


def nvmlDeviceGetName(handle) -> str:
    gpu = _enter("nvmlDeviceGetName", handle)
    return _answer(gpu, "nvmlDeviceGetName")


def nvmlDeviceGetPciInfo_v3(handle):
    gpu = _enter("nvmlDeviceGetPciInfo_v3", handle)
    info = _real.nvmlPciInfo_t()
    info.busId = gpu.pci_bus_id.encode()
    info.busIdLegacy = gpu.pci_bus_id[-12:].encode()
    domain, bus, device_function = gpu.pci_bus_id.split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device_function.split(".")[0], 16)
    info.pciDeviceId = int(_answer(gpu, "pciDeviceId"), 16)
    return info


def nvmlDeviceGetPciInfo(handle):
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _enter("nvmlDeviceGetMemoryInfo", handle)
    if version and "nvmlDeviceGetMemoryInfo_v2" in _require_host().missing_functions:
        raise _error("FunctionNotFound")
    memory = _answer(gpu, "nvmlDeviceGetMemoryInfo")
    free = memory["total"] - memory["reserved"] - memory["used"]
    if version:
        answer = _real.c_nvmlMemory_v2_t(
            version=version, total=memory["total"], reserved=memory["reserved"], free=free, used=memory["used"]
        )
    else:
        # The v1 API counts the memory the driver reserves as used.
        answer = _real.c_nvmlMemory_t(total=memory["total"], free=free, used=memory["total"] - free)
    return answer


def nvmlDeviceGetUtilizationRates(handle):
    gpu = _enter("nvmlDeviceGetUtilizationRates", handle)
    rates = _answer(gpu, "nvmlDeviceGetUtilizationRates")
    return _real.c_nvmlUtilization_t(gpu=rates["gpu"], memory=rates["memory"])


def nvmlDeviceGetPowerUsage(handle) -> int:
    return _answer(_enter("nvmlDeviceGetPowerUsage", handle), "nvmlDeviceGetPowerUsage")


def nvmlDeviceGetEnforcedPowerLimit(handle) -> int:
    return _answer(_enter("nvmlDeviceGetEnforcedPowerLimit", handle), "nvmlDeviceGetEnforcedPowerLimit")


def nvmlDeviceGetTotalEnergyConsumption(handle) -> int:
    gpu = _enter("nvmlDeviceGetTotalEnergyConsumption", handle)
    return _answer(gpu, "fields", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION")


def nvmlDeviceGetTemperature(handle, sensor: int) -> int:
    gpu = _enter("nvmlDeviceGetTemperature", handle)
    return _answer_for(gpu, "nvmlDeviceGetTemperature", sensor)


def nvmlDeviceGetClockInfo(handle, clock_type: int) -> int:
    gpu = _enter("nvmlDeviceGetClockInfo", handle)
    return _answer_for(gpu, "nvmlDeviceGetClockInfo", clock_type)


def nvmlDeviceGetMaxClockInfo(handle, clock_type: int) -> int:
    gpu = _enter("nvmlDeviceGetMaxClockInfo", handle)
    return _answer_for(gpu, "nvmlDeviceGetMaxClockInfo", clock_type)


def nvmlDeviceGetCurrentClocksEventReasons(handle) -> int:
    gpu = _enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
    return _answer(gpu, "nvmlDeviceGetCurrentClocksEventReasons")


def nvmlDeviceGetCurrentClocksThrottleReasons(handle) -> int:
    gpu = _enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return _answer(gpu, "nvmlDeviceGetCurrentClocksEventReasons")


def nvmlDeviceGetViolationStatus(handle, policy: int):
    gpu = _enter("nvmlDeviceGetViolationStatus", handle)
    answer = _real.c_nvmlViolationTime_t()
    answer.violationTime = _answer_for(gpu, "nvmlDeviceGetViolationStatus", policy)
    answer.referenceTime = int(time.time() * 1e6)
    return answer


def nvmlDeviceGetPcieReplayCounter(handle) -> int:
    gpu = _enter("nvmlDeviceGetPcieReplayCounter", handle)
    return _answer(gpu, "fields", "NVML_FI_DEV_PCIE_REPLAY_COUNTER")


def nvmlDeviceGetPcieThroughput(handle, counter: int) -> int:
    gpu = _enter("nvmlDeviceGetPcieThroughput", handle)
    return _answer_for(gpu, "nvmlDeviceGetPcieThroughput", counter)


def nvmlDeviceGetCurrPcieLinkGeneration(handle) -> int:
    return _answer(_enter("nvmlDeviceGetCurrPcieLinkGeneration", handle), "nvmlDeviceGetCurrPcieLinkGeneration")


def nvmlDeviceGetCurrPcieLinkWidth(handle) -> int:
    return _answer(_enter("nvmlDeviceGetCurrPcieLinkWidth", handle), "nvmlDeviceGetCurrPcieLinkWidth")


def nvmlDeviceGetMaxPcieLinkGeneration(handle) -> int:
    return _answer(_enter("nvmlDeviceGetMaxPcieLinkGeneration", handle), "nvmlDeviceGetMaxPcieLinkGeneration")


def nvmlDeviceGetMaxPcieLinkWidth(handle) -> int:
    return _answer(_enter("nvmlDeviceGetMaxPcieLinkWidth", handle), "nvmlDeviceGetMaxPcieLinkWidth")


def nvmlDeviceGetNvLinkState(handle, link: int) -> int:
    states = _answer(_enter("nvmlDeviceGetNvLinkState", handle), "nvmlDeviceGetNvLinkState")
    if link >= len(states):
        raise _error("InvalidArgument")
    return states[link]


def nvmlDeviceGetFieldValues(handle, field_ids):
    """Like NVML: one answer per requested field, each with its own nvmlReturn; the call itself succeeds."""
    gpu = _enter("nvmlDeviceGetFieldValues", handle)
    host = _require_host()
    _spend(host, sum(host.field_delays.get(r[0] if isinstance(r, tuple) else r, 0.0) for r in field_ids))
    values = (_real.c_nvmlFieldValue_t * len(field_ids))()
    for value, requested in zip(values, field_ids, strict=True):
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        value.fieldId, value.scopeId = field_id, scope
        value.timestamp = int(time.time() * 1e6)
        value_type, member = _FIELD_VALUE_TYPES.get(field_id, (_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal"))
        value.valueType = value_type
        name = _FIELD_NAMES.get(field_id, str(field_id))
        try:
            if field_id in _require_host().missing_fields:  # newer than the driver
                raise _error("InvalidArgument")
            if field_id in _FIELDS_FROM_CALLS and name not in _value(gpu.answers.get("fields", {})):
                spec = _answer(gpu, *_FIELDS_FROM_CALLS[field_id])
            else:
                spec = _answer(gpu, "fields", name)
            if field_id in _NVLINK_FIELDS:
                links = spec["per_link"]
                if scope == _UINT_MAX:  # the links' counters summed into one counter, read once
                    answer = _value(
                        {
                            "start": sum(link["start"] for link in links),
                            "per_second": sum(link["per_second"] for link in links),
                        }
                    )
                elif scope < len(links):
                    answer = _value(links[scope])
                else:
                    raise _error("InvalidArgument")
            else:
                answer = spec
            setattr(value.value, member, answer)
            value.nvmlReturn = _real.NVML_SUCCESS
        except _real.NVMLError as error:
            value.nvmlReturn = error.value
    return values


def _running_processes(call: str, handle, kind: str) -> list:
    """The host's processes on the GPU whose "type" ("C", "G" or "C+G", as nvidia-smi writes it; "C" when absent)
    includes `kind`, as pynvml returns them. Its unversioned name calls the v3 function: a driver without that
    raises pynvml's NVMLLibraryMismatchError, and the `_v2` name is the call that works there."""
    host = _require_host()
    if not call.endswith("_v2") and f"{call}_v3" in host.missing_functions:
        _enter(call)
        raise _real.NVMLLibraryMismatchError(
            "Unversioned function called and the pyNVML version does not match the NVML lib version."
        )
    gpu = _enter(call, handle)
    return [
        _real.nvmlFriendlyObject(
            {
                "pid": process["pid"],
                "usedGpuMemory": process["used_gpu_memory"],
                "gpuInstanceId": 0xFFFFFFFF,
                "computeInstanceId": 0xFFFFFFFF,
            }
        )
        for process in _listed(host).get(gpu.index, ())
        if kind in process.get("type", "C")
    ]


def _listed(host: _Host) -> dict[int, list[dict]]:
    """The host's processes by GPU index as NVML lists them now: under a launcher, each "watched" entry is the
    watched command's process, or is left out while there is none (module docstring)."""
    if not host.watches or not os.environ.get(SUPERVISOR_PID_ENV):
        return host.processes
    watched = _watched_command(host)
    return {
        index: [
            {**process, "pid": watched[0], "name": watched[1]} if watched and process.get("watched") else process
            for process in listed
            if watched or not process.get("watched")
        ]
        for index, listed in host.processes.items()
    }


def _watched_command(host: _Host) -> tuple[int, str] | None:
    """(pid, argv[0]) of the first process the launcher named in TRAINSTACK_SUPERVISOR_PID started, this one aside;
    None while there is none. Searched again only once the one found has ended: a search reads all of /proc."""
    import psutil  # only a host with a watched entry, run by a launcher, needs it

    supervisor = int(os.environ[SUPERVISOR_PID_ENV])
    if not _still_started_by(host.watched, supervisor):
        try:
            started = psutil.Process(supervisor).children()
        except psutil.NoSuchProcess:
            started = []
        host.watched = min(
            (child for child in started if child.pid != os.getpid()),
            key=lambda child: (child.create_time(), child.pid),
            default=None,
        )
    try:
        argv = host.watched.cmdline() if host.watched else []
    except psutil.NoSuchProcess:  # ended since (a zombie too: it holds no GPU)
        argv = []
    return (host.watched.pid, argv[0]) if host.watched and argv else None


def _still_started_by(process, supervisor: int) -> bool:
    """Whether the process found before still runs as the supervisor's child: not ended, not a zombie (psutil
    calls one running until it is reaped), and the child of this supervisor, not of one an earlier search found."""
    import psutil

    try:
        return process is not None and process.ppid() == supervisor and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _running_processes("nvmlDeviceGetComputeRunningProcesses", handle, "C")


def nvmlDeviceGetComputeRunningProcesses_v2(handle):
    return _running_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, "C")


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return _running_processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "G")


def nvmlDeviceGetGraphicsRunningProcesses_v2(handle):
    return _running_processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "G")


def nvmlSystemGetProcessName(pid: int) -> str:
    """A process's "name" in the host file (a watched command's: its argv[0]), on whichever GPU it is listed;
    NVML's NotFound for a process it cannot see (not listed, or listed without a name: one outside the caller's PID
    namespace)."""
    _enter("nvmlSystemGetProcessName")
    names = {process["pid"]: process.get("name") for listed in _listed(_require_host()).values() for process in listed}
    name = names.get(pid)
    if name is None:
        raise _error("NotFound")
    return name


def nvmlEventSetCreate():
    _enter("nvmlEventSetCreate")
    host = _require_host()
    host.event_sets.append([set(), []])
    return ctypes.cast(ctypes.c_void_p(0x9000 + len(host.event_sets)), _real.c_nvmlEventSet_t)


def _event_set(event_set) -> list:
    address = ctypes.cast(event_set, ctypes.c_void_p).value
    assert address is not None, "an event set nvmlEventSetCreate made is never NULL"
    index = address - 0x9001
    return _require_host().event_sets[index]


def nvmlDeviceRegisterEvents(handle, event_types: int, event_set) -> None:
    gpu = _enter("nvmlDeviceRegisterEvents", handle)
    if event_types & ~_answer(gpu, "nvmlDeviceGetSupportedEventTypes"):
        raise _error("NotSupported")
    _event_set(event_set)[0].add(gpu.index)


def nvmlEventSetWait_v2(event_set, timeout_ms: int):
    """Never blocks, whatever the timeout: with nothing pending it raises NVMLError_Timeout at once."""
    _enter("nvmlEventSetWait_v2")
    host = _require_host()
    registered, pending = _event_set(event_set)
    elapsed = time.monotonic() - host.started
    for event in [e for e in host.scheduled_xids if e["after_seconds"] <= elapsed]:
        host.scheduled_xids.remove(event)
        if event["gpu"] in registered:
            pending.append((host.gpus[event["gpu"]].handle, event["xid"]))
    if not pending:
        raise _error("Timeout")
    handle, xid = pending.pop(0)
    data = _real.c_nvmlEventData_t()
    data.device = handle
    data.eventType = _real.nvmlEventTypeXidCriticalError
    data.eventData = xid
    return data


def nvmlEventSetWait(event_set, timeout_ms: int):
    return nvmlEventSetWait_v2(event_set, timeout_ms)


def nvmlEventSetFree(event_set) -> None:
    _enter("nvmlEventSetFree")


# GPM (Hopper and newer): its calls and `set_gpm()` live in gpm.py, which gets the helpers above from here.
from trainstack.monitoring.nvml_fake import gpm as _gpm  # noqa: E402

_gpm.bind(enter=_enter, answer=_answer, error=_error, value=_value, require_host=_require_host)
globals().update({name: getattr(_gpm, name) for name in _gpm.API})


if os.environ.get("NVML_FAKE_HOST"):
    load(os.environ["NVML_FAKE_HOST"])
    if os.environ.get("NVML_FAKE_DELAY_US"):
        _delay_from_environment(os.environ["NVML_FAKE_DELAY_US"], os.environ.get("NVML_FAKE_DELAY_MODE", "sleep"))
