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
import sys

from side_by_side import halves_for_pair, report
from train_run import TrainRun

from trainstack.hang import FR_SWITCH_ENV

TARGET = 0.99


def start_run(recorder: bool, cpus: set[int], args: argparse.Namespace) -> TrainRun:
    flags = ["--exporter-port", "0", "--no-report"]
    return TrainRun(args.steps, args.batch_size, 1, flags, {FR_SWITCH_ENV: "1" if recorder else "0"}, cpus)


def steps_per_second(run: TrainRun, batch_size: int) -> float:
    return run.summary()["samples_per_second"] / (batch_size * 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    on_rates, off_rates = [], []
    for repeat in range(args.repeats):
        on_cpus, off_cpus = halves_for_pair(repeat)
        on, off = start_run(True, on_cpus, args), start_run(False, off_cpus, args)
        on_rate, off_rate = steps_per_second(on, args.batch_size), steps_per_second(off, args.batch_size)
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
