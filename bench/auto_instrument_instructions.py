"""What `trainstack watch`'s automatic instrumentation adds to a step, counted in instructions, not timed: the
side-by-side bench (auto_instrument_overhead.py) moves by a few percent from pair to pair on a shared 2-vCPU
machine, more than the cost it is after. Here one gloo rank (a world of one, so no peer's speed enters) runs a
plain DDP loop with no trainstack line under valgrind's callgrind, watched with the instrumentation on and off, for
two step counts; the instructions a step are the difference between the two counts' totals over the extra steps,
which leaves the start-up (torch's import, the monitor's) out. The garbage collector's objects are frozen once the
model is built, so a full collection, which lands at different steps in the two runs, does not count.

Instructions are not time: they leave out the caches the hooks' code and data evict, which the side-by-side bench
sees. They say, run after run and to a few thousand, how much work the per-step path does.

`--without PART ...` also counts the instrumented loop with each PART left out, to say what it costs: `comm` (the
DDP communication timing, trainstack/telemetry/comm.py), `intervals` (the record cut every 10 steps: one interval
for the whole run instead) or `series` (the prometheus series: none). Each is a patch of the rank's trainstack
made by the bench (auto_instrument_overhead.leave_out), never an option of trainstack's.

    .venv/bin/python bench/auto_instrument_instructions.py [--steps 200 600] [--without comm intervals series]

Needs valgrind (Debian's `valgrind`); four runs of about 90 s, two at a time, and two more for each PART.

Run with `--rank-loop STEPS`, it is the loop itself.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from auto_instrument_overhead import PARTS, WITHOUT_ENV, leave_out, plain_ddp_loop, watch_command

from trainstack.rundir import RUN_DIR_ENV, free_port

WARM_UP, WIDTH, BATCH = 100, 64, 8
"""A small model: its compute is the same in both runs, and the smaller it is, the faster valgrind runs it."""


def rank_loop(steps: int) -> None:
    import gc

    import torch.distributed as dist

    if part := os.environ.get(WITHOUT_ENV):
        leave_out(part)
    dist.init_process_group("gloo", rank=0, world_size=1)
    loader, step = plain_ddp_loop(WIDTH, BATCH, steps + WARM_UP)
    gc.freeze()
    for batch, targets in loader:
        step(batch, targets)
    dist.destroy_process_group()


def instructions(auto: bool, steps: int, scratch: Path, without: str = "") -> int:
    """The instructions the rank executed, start to exit; `without`: a PART left out."""
    name = f"{auto}-{without}-{steps}"
    out = scratch / f"callgrind-{name}.out"
    rank = [sys.executable, __file__, "--rank-loop", str(steps)]
    command = watch_command(
        scratch / f"run-{name}", auto, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *rank]
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",  # the same dict layouts, lookups and string hashes in every run
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        WITHOUT_ENV: without,
    }
    env.pop(RUN_DIR_ENV, None)
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    collected = re.search(r"Collected : (\d+)", finished.stderr)
    if finished.returncode != 0 or collected is None:
        sys.exit(f"a run under callgrind failed ({finished.returncode}): {finished.stderr[-2000:]}")
    return int(collected.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=[200, 600], metavar=("FEW", "MANY"))
    parser.add_argument("--without", nargs="+", choices=PARTS, default=[], metavar="PART")
    parser.add_argument("--rank-loop", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_loop:
        rank_loop(args.rank_loop)
        return 0
    if shutil.which("valgrind") is None:
        sys.exit("needs valgrind on PATH: install Debian's valgrind package")
    few, many = args.steps
    if many <= few:
        sys.exit(f"--steps: the second count ({many}) must be larger than the first ({few})")
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(2) as pool:

        def per_step(auto: bool, without: str = "") -> float:
            totals = list(pool.map(instructions, (auto, auto), (few, many), (Path(folder),) * 2, (without,) * 2))
            return (totals[1] - totals[0]) / (many - few)

        plain, instrumented = per_step(False), per_step(True)
        added = instrumented - plain
        print(
            f"instructions a step: {plain:,.0f} plain, {instrumented:,.0f} instrumented: "
            f"+{added:,.0f} ({added / plain:+.1%}); one gloo rank, a {WIDTH}-wide MLP on {BATCH} samples",
            flush=True,
        )
        for part in args.without:
            cost = instrumented - per_step(True, part)
            print(f"  {part}: {cost:+,.0f} a step ({cost / added:.0%} of what the instrumentation adds)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
