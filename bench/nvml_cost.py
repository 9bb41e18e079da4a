"""What NVML costs the exporter on this machine's driver, next to the h100_driver580 profile the NVML fake uses.

On one GPU (--gpu): each NVML call the exporter's sampler makes, --calls times: its mean CPU time (of the calling
thread) and wall time; the field-values call with the GPU's slow request and with each of its fields alone. Then
`NvmlSession.read` per GPU, through the exporter's own session, back to back: a fast sample and a slow sample.
Then the exporter's sampler itself, run as the exporter runs it (a sample a second, on its own thread, so each
sample finds the caches as cold as in production) for --sampler-seconds with the slow part every 10 s: its own
counters give a fast and a slow sample's CPU on this host. For 8 GPUs, each GPU beyond this host's adds its
back-to-back cost; that gives the sampler's share of one core at the exporter's defaults (a sample a second, slow
fields every 30 s).
The same measurement runs in the same process on the NVML fake loaded with the profile
(monitoring/nvml_fake/hosts/h100_driver580.json), printed next to the driver's figures, so a profile that has drifted
from the driver shows. Without a driver the driver's column says so and the profile's is still measured.

Target (issue 14): the sampler under 0.3% of one core at 1 Hz for 8 GPUs. About 55 s on an H100.

    python3 bench/nvml_cost.py [--calls 200] [--gpu 0] [--profile h100_driver580]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: trainstack comes from this checkout
from trainstack.monitoring.exporter.config import DEFAULT_SAMPLE_INTERVAL, DEFAULT_SLOW_SAMPLE_INTERVAL  # noqa: E402
from trainstack.monitoring.exporter.nvml import (  # noqa: E402
    CLOCK_SM,
    FIELD_NAMES,
    MEMORY_INFO_V2,
    TEMPERATURE_GPU,
    NvmlSession,
    error_name,
)
from trainstack.monitoring.exporter.sampler import Sampler  # noqa: E402

TARGET_GPUS = 8
SAMPLER_TARGET_SHARE = 0.003
NO_FIGURE = "-"


def timed(function: Callable[[], object], calls: int) -> tuple[str, str]:
    """Mean CPU and wall milliseconds of one call, as text; the error's name if the call fails."""
    try:
        function()  # the first call may load or initialise something in the driver
    except Exception as error:
        return f"({error_name(error)})", NO_FIGURE
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        function()
    return f"{(time.thread_time() - cpu) / calls * 1e3:.4f}", f"{(time.perf_counter() - wall) / calls * 1e3:.4f}"


def per_gpu_sample(session: NvmlSession, slow: bool, reads: int) -> tuple[float, float]:
    """CPU and wall milliseconds per GPU of one NvmlSession.read."""
    gpus = max(1, len(session.read(slow=slow).samples))
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(reads):
        session.read(slow=slow)
    return ((time.thread_time() - cpu) / reads / gpus * 1e3, (time.perf_counter() - wall) / reads / gpus * 1e3)


def sampler_samples(session: NvmlSession, seconds: float) -> tuple[float, float]:
    """CPU ms of one fast and one slow sample of all GPUs, from the exporter's sampler running at one sample a
    second for `seconds`."""
    sampler = Sampler(session, DEFAULT_SAMPLE_INTERVAL, min(10.0, max(seconds / 2, 1.0)))
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    cost = sampler.cost()
    fast, slow = (cost.cpu_seconds[c] / max(1, cost.samples[c]) * 1e3 for c in ("fast", "slow"))
    return fast, slow


def measure(nvml, gpu_index: int, calls: int, sampler_seconds: float) -> dict:
    """Every figure for one NVML module (the driver's pynvml or the fake), keyed by row name."""
    session = NvmlSession(nvml)
    if not session.up:
        return {"about": f"no driver here ({session.down_reason})"}
    gpus = session.read(slow=False).gpus
    gpu = next((g for g in gpus if g.index == gpu_index), None)
    if gpu is None:
        session.close()
        return {"about": f"no GPU {gpu_index} (NVML sees {len(gpus)})"}
    handle, rows = gpu.handle, {}
    for name, function in (
        ("nvmlDeviceGetUtilizationRates", lambda: nvml.nvmlDeviceGetUtilizationRates(handle)),
        ("nvmlDeviceGetPowerUsage", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
        ("nvmlDeviceGetTemperature", lambda: nvml.nvmlDeviceGetTemperature(handle, TEMPERATURE_GPU)),
        ("nvmlDeviceGetClockInfo", lambda: nvml.nvmlDeviceGetClockInfo(handle, CLOCK_SM)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        ("nvmlDeviceGetMemoryInfo (v2)", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=MEMORY_INFO_V2)),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)),
        ("nvmlDeviceGetGraphicsRunningProcesses", lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)),
        ("nvmlDeviceGetPcieReplayCounter", lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle)),
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        (
            f"nvmlDeviceGetFieldValues, the slow request ({len(gpu.field_requests)} fields)",
            lambda: nvml.nvmlDeviceGetFieldValues(handle, list(gpu.field_requests)),
        ),
    ):
        rows[name] = timed(function, calls)
    for request in gpu.field_requests:
        name = f"  field {request[0]} alone ({FIELD_NAMES.get(request[0], '?').removeprefix('NVML_FI_DEV_')})"
        rows[name] = timed(lambda request=request: nvml.nvmlDeviceGetFieldValues(handle, [request]), calls)
    fast = per_gpu_sample(session, slow=False, reads=calls)
    slow = per_gpu_sample(session, slow=True, reads=max(5, calls // 10))
    rows["per GPU: a fast sample (NvmlSession.read)"] = tuple(f"{ms:.4f}" for ms in fast)
    rows["per GPU: a slow sample (fast + slow part)"] = tuple(f"{ms:.4f}" for ms in slow)
    sampler_fast, sampler_slow = sampler_samples(session, sampler_seconds)
    rows[f"the sampler's fast sample of {len(gpus)} GPU(s), 1 a second"] = (f"{sampler_fast:.4f}", NO_FIGURE)
    rows[f"the sampler's slow sample of {len(gpus)} GPU(s)"] = (f"{sampler_slow:.4f}", NO_FIGURE)
    # 8 GPUs: what this host's sample costs (its first GPU's reads with cold caches, the sample's fixed part) and
    # the back-to-back cost of each further GPU.
    more = TARGET_GPUS - len(gpus)
    fast_8, slow_8 = sampler_fast + more * fast[0], sampler_slow + more * slow[0]
    per_slow = DEFAULT_SLOW_SAMPLE_INTERVAL / DEFAULT_SAMPLE_INTERVAL  # samples per slow read, the last one slow
    share = (fast_8 * (per_slow - 1) + slow_8) / 1e3 / DEFAULT_SLOW_SAMPLE_INTERVAL
    about = f"driver {session.driver_version}, {gpu.name}, GPU {gpu.index} of {len(gpus)}"
    session.close()
    return {"about": about, "rows": rows, "share": share}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per figure (default 200, as the issue's)")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU measured (default 0)")
    parser.add_argument("--profile", default="h100_driver580", help="host cost profile in monitoring/nvml_fake/hosts")
    parser.add_argument("--nvml-module", default="pynvml", help="the driver's NVML module (default pynvml)")
    parser.add_argument(
        "--sampler-seconds",
        type=float,
        default=20.0,
        help="how long the sampler runs at one sample a second, per column (default 20)",
    )
    args = parser.parse_args()

    try:
        driver = measure(importlib.import_module(args.nvml_module), args.gpu, args.calls, args.sampler_seconds)
    except ImportError as error:
        driver = {"about": f"{args.nvml_module} cannot be imported ({error})"}
    # After the driver's measurement: nothing of the fake is loaded during it.
    import trainstack.monitoring.nvml_fake as fake

    fake.load(args.profile)
    profile = measure(fake, 0, args.calls, args.sampler_seconds)
    fake.load(None)

    print(f"NVML cost, mean of {args.calls} calls, CPU ms / wall ms per call")
    print(f"  this machine: {driver['about']}")
    print(f"  profile {args.profile} (the NVML fake): {profile['about']}")
    width = max(len(name) for name in profile["rows"]) + 2
    print(f"{'':<{width}}{'driver CPU':>12}{'wall':>10}{'profile CPU':>14}{'wall':>10}")
    for name, (cpu, wall) in profile["rows"].items():
        driver_cpu, driver_wall = driver.get("rows", {}).get(name, (NO_FIGURE, NO_FIGURE))
        print(f"{name:<{width}}{driver_cpu:>12}{driver_wall:>10}{cpu:>14}{wall:>10}")
    for name in driver.get("rows", {}).keys() - profile["rows"].keys():  # a field the profile's GPU lacks
        print(f"{name:<{width}}{driver['rows'][name][0]:>12}{driver['rows'][name][1]:>10}")
    shares = [
        f"{figures['share'] * 100:.3f}% ({who})"
        for who, figures in (("driver", driver), ("profile", profile))
        if "share" in figures
    ]
    met = " ".join(
        "met" if figures["share"] < SAMPLER_TARGET_SHARE else "MISSED"
        for figures in (driver, profile)
        if "share" in figures
    )
    print(
        f"sampler at 1 sample/s, slow fields every {DEFAULT_SLOW_SAMPLE_INTERVAL:g} s, {TARGET_GPUS} GPUs: "
        f"{' / '.join(shares)} of one core (target < {SAMPLER_TARGET_SHARE * 100:g}%: {met})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
