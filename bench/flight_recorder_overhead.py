"""Flight Recorder overhead: steps/s with PyTorch's Flight Recorder on (what `trainstack train` and `trainstack
watch` hand their ranks by default: TORCH_FR_BUFFER_SIZE=2000, trainstack/hang.py) against off
(TRAINSTACK_FLIGHT_RECORDER=0), everything else equal (2 CPU ranks over gloo, default model and data, telemetry on,
no exporter, no periodic checkpoint). Run side by side as bench/telemetry_overhead.py runs its pairs: each run on its
own half of the CPUs, the halves swapped at every pair, the geometric mean of the per-pair ratios.

The recorder appends one entry per collective (a DDP step's gradient buckets: a few per step here) to a ring
buffer; 2000 entries of a few hundred bytes each are its memory. Target: on/off >= 0.99, as telemetry's.

    .venv/bin/python bench/flight_recorder_overhead.py [--steps 200] [--repeats 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import halves_for_pair, pinned, report

from trainstack.hang import FR_SWITCH_ENV
from trainstack.rundir import RunDir, read_summary

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
TARGET = 0.99


class Run:
    def __init__(self, recorder: bool, cpus: set[int], args: argparse.Namespace):
        self._tmp = tempfile.TemporaryDirectory(prefix="fr-overhead-")
        self.run_dir = Path(self._tmp.name) / "run"
        command = [
            sys.executable,
            "-m",
            "trainstack",
            "train",
            "--output-dir",
            str(self.run_dir),
            "--max-steps",
            str(args.steps),
            "--batch-size",
            str(args.batch_size),
            "--num-workers",
            "1",
            "--checkpoint-every",
            "0",
            "--resume",
            "never",
            "--exporter-port",
            "0",
            "--no-report",
        ]
        env = {**ENV, FR_SWITCH_ENV: "1" if recorder else "0"}
        self.process = subprocess.Popen(
            pinned(command, cpus), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def steps_per_second(self, batch_size: int) -> float:
        stderr = self.process.communicate()[1]
        try:
            if self.process.returncode != 0:
                sys.exit(f"training run failed (exit {self.process.returncode}):\n{stderr[-4000:]}")
            return read_summary(RunDir(self.run_dir).summary)["samples_per_second"] / (batch_size * 2)
        finally:
            self._tmp.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    on_rates, off_rates = [], []
    for repeat in range(args.repeats):
        on_cpus, off_cpus = halves_for_pair(repeat)
        on, off = Run(True, on_cpus, args), Run(False, off_cpus, args)
        on_rate, off_rate = on.steps_per_second(args.batch_size), off.steps_per_second(args.batch_size)
        on_rates.append(on_rate)
        off_rates.append(off_rate)
        print(
            f"pair {repeat + 1}: on {on_rate:.3f} steps/s (CPUs {sorted(on_cpus)}), off {off_rate:.3f} steps/s "
            f"(CPUs {sorted(off_cpus)}), ratio {on_rate / off_rate:.3f}  (load average "
            f"{os.getloadavg()[0]:.1f})",
            flush=True,
        )
    print(report("Flight Recorder on (2000)", "Flight Recorder off", on_rates, off_rates, TARGET))
    return 0


if __name__ == "__main__":
    sys.exit(main())
