"""Scrape cost of the exporter: p50/p99 latency and CPU seconds per scrape, 8 GPUs and 8 ranks.

The exporter runs as it does in production (`python -m monitoring.exporter`, its own process, HTTP on 127.0.0.1)
with the NVML fake standing in for the driver: an 8-GPU H100 host (tests/nvml_fake/hosts/dgx_h100.json) where
every NVML call takes a realistic time, and a metrics directory holding 8 ranks' multiprocess files with every
training metric of docs/architecture.md, each rank's process listed on its GPU so the per-process memory call runs.

Per-call time (default 100 us, process listing 500 us): NVML answers most queries from the driver's cached state;
gpustat's maintainers measured ~2,700 nvmlDeviceGetPowerUsage calls/s on a Tesla K40m (~365 us each, an old
Kepler board and driver; github.com/wookayin/gpustat/issues/76), and codecarbon's NVML benchmark models 35-50 us
for utilization, memory, power, energy and temperature queries and 500 us for the process listing
(github.com/mlco2/codecarbon/pull/1264). 100 us sits between the two; run with --delay-us 200 or 365 for margin.
By default the fake spends that time blocked, as a process waiting on the driver does; --delay-mode spin spends it
on the CPU instead (the worst case for the CPU figure).

Targets (issue 3): p99 < 25 ms, and under 1% of one core at one scrape per second (< 10 ms CPU per scrape).

    .venv/bin/python bench/scrape_cost.py [--scrapes 300] [--delay-us 100] [--delay-mode sleep|spin]
                                          [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: tests.nvml_fake comes from the checkout
from tests.nvml_fake.ranks import write_rank  # noqa: E402

GPUS = RANKS = 8
P99_TARGET_SECONDS = 0.025
CPU_TARGET_SHARE = 0.01
# What Prometheus 2.x asks for: OpenMetrics if offered, gzip-compressed.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def write_ranks(metrics_dir: Path) -> list[int]:
    """8 ranks' multiprocess files, as ranks on GPUs leave them (stand-ins: tests/nvml_fake/ranks.py)."""
    return [write_rank(metrics_dir, rank, steps=1000, on_gpu=True, world_size=RANKS) for rank in range(RANKS)]


def host_with_ranks(rank_pids: list[int]) -> dict:
    host = json.loads((REPO / "tests" / "nvml_fake" / "hosts" / "dgx_h100.json").read_text())
    host["processes"] = {str(gpu): [{"pid": pid, "used_gpu_memory": 61 << 30}, {"pid": 1, "used_gpu_memory": 1 << 20}]
                         for gpu, pid in enumerate(rank_pids)}
    return host


def start_exporter(metrics_dir: Path, host_file: Path, delay: str, mode: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NVML_FAKE_HOST": str(host_file),
           "NVML_FAKE_DELAY_US": delay, "NVML_FAKE_DELAY_MODE": mode}
    process = subprocess.Popen([sys.executable, "-m", "monitoring.exporter", "--port", "0", "--nvml-module",
                                "tests.nvml_fake", "--metrics-dir", str(metrics_dir)],
                               cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()
    if "serving http://" not in line:
        process.kill()
        sys.exit(f"the exporter did not start: {line}{process.stderr.read()}")
    return process, int(line.split("http://127.0.0.1:")[1].split("/")[0])


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time of the process, threads that have ended included (each scrape runs in a thread of its own)."""
    times = process.cpu_times()
    return times.user + times.system


def running_threads_cpu_seconds(pid: int) -> float:
    """CPU time of the process's live threads in nanoseconds' precision (the scheduler's own count): idle CPU is
    too small for `cpu_seconds`, which the kernel counts in 10 ms ticks."""
    return sum(int(path.read_text().split()[0]) for path in Path(f"/proc/{pid}/task").glob("*/schedstat")) / 1e9


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=PROMETHEUS_HEADERS), timeout=30) as response:
        return gzip.decompress(response.read())


def collector_seconds(text: str, collector: str) -> float:
    prefix = f'trainstack_exporter_collector_duration_seconds{{collector="{collector}"}}'
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(prefix))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--delay-us", type=float, default=100.0, help="time each NVML call takes (default 100)")
    parser.add_argument("--process-delay-us", type=float, default=500.0,
                        help="time nvmlDeviceGetComputeRunningProcesses takes (default 500)")
    parser.add_argument("--delay-mode", choices=("sleep", "serial", "spin"), default="sleep")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="how long idle CPU is measured")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="scrape-cost-") as tmp:
        metrics_dir = Path(tmp) / "metrics"
        metrics_dir.mkdir()
        host_file = Path(tmp) / "host.json"
        host_file.write_text(json.dumps(host_with_ranks(write_ranks(metrics_dir))))
        delay = f"{args.delay_us},nvmlDeviceGetComputeRunningProcesses={args.process_delay_us}"
        exporter, port = start_exporter(metrics_dir, host_file, delay, args.delay_mode)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            for _ in range(10):  # warm up: imports, first reads of the files
                scrape(url)
            process = psutil.Process(exporter.pid)
            time.sleep(1)  # the last warm-up scrape's request thread ends: its time would leave the live count
            idle_start = running_threads_cpu_seconds(exporter.pid)
            time.sleep(args.idle_seconds)
            idle_cpu_per_second = (running_threads_cpu_seconds(exporter.pid) - idle_start) / args.idle_seconds
            latencies = []
            cpu_start = cpu_seconds(process)
            for _ in range(args.scrapes):
                start = time.perf_counter()
                body = scrape(url)
                latencies.append(time.perf_counter() - start)
            cpu_per_scrape = (cpu_seconds(process) - cpu_start) / args.scrapes
        finally:
            exporter.terminate()
            exporter.wait(timeout=60)
            exporter.stderr.close()

    text = body.decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    core_share = cpu_per_scrape * 1.0 + idle_cpu_per_second  # one scrape per second
    print(f"scrape cost: {GPUS} fake GPUs ({args.delay_us:g} us per NVML call, {args.process_delay_us:g} us per "
          f"process listing, delay mode {args.delay_mode}), {RANKS} ranks, {args.scrapes} scrapes, {series} series, "
          f"{len(body) / 1024:.0f} KiB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  latency p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {max(latencies) * 1e3:.2f} ms "
          f"(target p99 < {P99_TARGET_SECONDS * 1e3:.0f} ms: {'met' if p99 < P99_TARGET_SECONDS else 'MISSED'})")
    print(f"  collectors in the last scrape: gpu {collector_seconds(text, 'gpu') * 1e3:.2f} ms, "
          f"training {collector_seconds(text, 'training') * 1e3:.2f} ms")
    print(f"  CPU {cpu_per_scrape * 1e3:.2f} ms per scrape + {idle_cpu_per_second * 1e3:.3f} ms/s idle = "
          f"{core_share * 100:.2f}% of one core at 1 scrape/s "
          f"(target < {CPU_TARGET_SHARE * 100:.0f}%: {'met' if core_share < CPU_TARGET_SHARE else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
