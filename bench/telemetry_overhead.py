"""Telemetry overhead: steps/s with telemetry on and the exporter scraped every second, against telemetry off.

Same run config for both (2 CPU ranks, default model and data, no periodic checkpoint), run side by side: the
two runs train at the same time, each pinned to its own half of the CPUs (the exporter shares the "on" run's
half, so its cost counts against that run), so whatever else loads the machine loads both alike. The halves
swap at every repeat. "On" is what `trainstack train` does by default (per-rank metrics files, the exporter the
launcher starts) plus a scraper reading /metrics once a second, as Prometheus would; "off" is
`--no-telemetry --exporter-port 0`. Steps/s is each run's training-loop throughput from summary.json (samples/s
over the global batch).

Target (issue 3): on/off >= 0.99.

    .venv/bin/python bench/telemetry_overhead.py [--steps 200] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

from bench.side_by_side import free_port, halves_for_pair, pinned, report

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
WORLD_SIZE = 2
TARGET = 0.99


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


class Run:
    """One `trainstack train` pinned to `cpus`; with telemetry, its exporter is scraped once a second."""

    def __init__(self, telemetry: bool, cpus: set[int], args: argparse.Namespace):
        self._tmp = tempfile.TemporaryDirectory(prefix="telemetry-overhead-")
        self.run_dir = Path(self._tmp.name) / "run"
        command = [sys.executable, "-m", "train.cli", "train", "--output-dir", str(self.run_dir),
                   "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
                   "--num-workers", str(args.num_workers), "--checkpoint-every", "0", "--resume", "never"]
        self.scraper = None
        if telemetry:
            port = free_port()
            command += ["--exporter-port", str(port)]
            self.scraper = Scraper(port)
        else:
            command += ["--no-telemetry", "--exporter-port", "0"]
        self.process = subprocess.Popen(pinned(command, cpus), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)

    def steps_per_second(self, batch_size: int) -> tuple[float, int]:
        """Waits for the run; returns its loop steps/s and how many scrapes its exporter answered."""
        stderr = self.process.communicate()[1]
        scrapes = self.scraper.stop() if self.scraper else 0
        try:
            if self.process.returncode != 0:
                sys.exit(f"training run failed (exit {self.process.returncode}):\n{stderr[-4000:]}")
            summary = json.loads((self.run_dir / "summary.json").read_text())
            return summary["samples_per_second"] / (batch_size * WORLD_SIZE), scrapes
        finally:
            self._tmp.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4, help="on/off pairs (the CPU halves swap each time)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()

    on_rates, off_rates = [], []
    for repeat in range(args.repeats):
        on_cpus, off_cpus = halves_for_pair(repeat)
        on, off = Run(True, on_cpus, args), Run(False, off_cpus, args)
        (on_rate, scrapes), (off_rate, _) = on.steps_per_second(args.batch_size), off.steps_per_second(args.batch_size)
        on_rates.append(on_rate)
        off_rates.append(off_rate)
        print(f"pair {repeat + 1}: on {on_rate:.3f} steps/s (CPUs {sorted(on_cpus)}, {scrapes} scrapes), "
              f"off {off_rate:.3f} steps/s (CPUs {sorted(off_cpus)}), ratio {on_rate / off_rate:.3f}  "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    print(report("telemetry on, scraped 1/s", "telemetry off", on_rates, off_rates, TARGET))
    return 0


if __name__ == "__main__":
    sys.exit(main())
