"""Telemetry overhead: steps/s with telemetry on and the exporter scraped every second, against telemetry off.

Same run config for both (2 CPU ranks, default model and data, no periodic checkpoint), alternated in one
invocation as on/off, off/on, on/off... so drift in machine load hits both sides alike. "On" is what
`trainstack train` does by default (per-rank metrics files, the exporter the launcher starts) plus a scraper
reading /metrics once a second, as Prometheus would; "off" is `--no-telemetry --exporter-port 0`. Steps/s is
each run's training-loop throughput from summary.json (samples/s over the global batch).

Target (issue 3): on/off >= 0.99.

    .venv/bin/python bench/telemetry_overhead.py [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
WORLD_SIZE = 2
TARGET = 0.99


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Scraper:
    """Reads /metrics once a second until stopped, as Prometheus would; counts the scrapes that succeeded."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
                self.scrapes += 1
            except (urllib.error.URLError, ConnectionError):
                pass  # the exporter is not up yet, or already stopped

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.scrapes


def steps_per_second(telemetry: bool, steps: int, batch_size: int, num_workers: int) -> tuple[float, int]:
    """One run; returns its loop steps/s and how many scrapes the exporter answered."""
    with tempfile.TemporaryDirectory(prefix="telemetry-overhead-") as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "train.cli", "train", "--output-dir", str(run_dir), "--max-steps", str(steps),
                   "--batch-size", str(batch_size), "--num-workers", str(num_workers), "--checkpoint-every", "0",
                   "--resume", "never"]
        scraper = None
        if telemetry:
            port = free_port()
            command += ["--exporter-port", str(port)]
            scraper = Scraper(port)
        else:
            command += ["--no-telemetry", "--exporter-port", "0"]
        try:
            result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True)
        finally:
            scrapes = scraper.stop() if scraper else 0
        if result.returncode != 0:
            sys.exit(f"training run failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        return summary["samples_per_second"] / (batch_size * WORLD_SIZE), scrapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="on/off pairs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()

    ratios, on_rates, off_rates = [], [], []
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        rates = {}
        for telemetry in order:
            rates[telemetry], scrapes = steps_per_second(telemetry, args.steps, args.batch_size, args.num_workers)
            if telemetry:
                scraped = scrapes
        on_rates.append(rates[True])
        off_rates.append(rates[False])
        ratios.append(rates[True] / rates[False])
        print(f"pair {repeat + 1}: on {rates[True]:.3f} steps/s ({scraped} scrapes), off {rates[False]:.3f} steps/s, "
              f"ratio {ratios[-1]:.3f}  (load average {os.getloadavg()[0]:.1f})", flush=True)
    ratio = statistics.median(ratios)
    print(f"telemetry on + exporter scraped 1/s: {statistics.median(on_rates):.3f} steps/s (median of {args.repeats})")
    print(f"telemetry off                      : {statistics.median(off_rates):.3f} steps/s (median of {args.repeats})")
    print(f"ratio on/off: {ratio:.3f} (median of pairs; spread {min(ratios):.3f}-{max(ratios):.3f}); "
          f"target >= {TARGET}: {'met' if ratio >= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
