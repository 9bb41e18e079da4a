"""What `trainstack watch`'s automatic instrumentation (trainstack/auto/) costs: a plain DDP loop with no trainstack
line, watched with it on against `--no-auto`, side by side: both at once, interleaved over the CPUs, each rank pinned
to the CPU of its local rank, so that each CPU runs one rank of either run (the other first every other pair); and
what the start-up hook costs a Python process that is no rank: `python -c pass` with the hook on its PYTHONPATH
against without, alternated.

Why interleaved: the two vCPUs of a small cloud machine run at speeds that part by up to a fifth for seconds at a
time. Pinned each to its own half (bench/side_by_side.py), the two runs' pairs read 0.83-1.04 for the same code;
interleaved, every run's ranks share each CPU's speed with the other run's, and the pairs read within 0.05 of
each other.

Targets (issue 43): instrumented / plain steps/s >= 0.99; the hook adds <= 50 ms to `python -c pass`.

    .venv/bin/python bench/auto_instrument_overhead.py [--pairs 4] [--steps 200] [--starts 20] [--batch 128]
        [--width 1024]

`--batch` scales the step's compute and leaves its gradients (and so the per-step cost of timing them) as they are:
the default's short step is where a fixed cost per step shows most. `--width` scales both: a narrow model (64) steps
in a few milliseconds, where the instrumentation's own Python a step is most of what the two runs differ by. The
bench also prints the CPU time of rank 0's loop thread per step, instrumented against not, and of all rank 0's
threads (gloo's, the hang responder's), which says whether any of the cost lies outside the loop.

Run with `--rank-loop STEPS OUT BATCH WIDTH` by torchrun, it is the loop itself: 2 ranks over gloo, a DataLoader of
ready batches, SGD; rank 0 writes its steps/s and its loop thread's and whole process's CPU time per step after the
warm-up to OUT.

Each pair's line also gives rank 0's loop thread's minor page faults a step. With glibc's malloc as it comes, a
CPU rank's large tensors (activations and gradients of megabytes) come from the heap and go back to the system as
its top is trimmed, and are faulted in again at the next step: how much of that a step does moves with every other
allocation of the process, the instrumentation's small ones among them. In this bench the instrumented run faulted
about 500 pages a step more (2 MB: 1,300 against 800), about 1 ms of system time and the cache misses of zeroing
them, the whole of what the two runs then differed by. `--allocator steady` runs both with glibc's heap never
trimmed and large tensors never mapped alone (STEADY_ALLOCATOR), as jemalloc or tcmalloc (which PyTorch's CPU
performance guide recommends) keep them: what the instrumentation itself costs.

`--leave-out PART` leaves PART out of the instrumented run (`comm`, `intervals` or `series`, as
bench/auto_instrument_instructions.py's `--without` says): what the rest costs, and so what PART does.

`--gpu` measures the same on one CUDA GPU instead: bench/plain_gpu_loop.py (a transformer language model in bf16 on
one NCCL rank), watched with the instrumentation on and off one after the other, the other first every other pair
(side by side, two runs would share the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from side_by_side import report

from trainstack.auto import instrumented_environment
from trainstack.rundir import RUN_DIR_ENV, free_port

STEPS_TARGET = 0.99
STEADY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""glibc's malloc tunables for `--allocator steady`: blocks under 64 MB from the heap, never a mapping of their own,
and the heap's top given back only past 256 MB: the pages a step frees stay for the next step's tensors."""
START_TARGET_MS = 50.0
WARM_UP = 20
WIDTH, BATCH = 1024, 128
"""About 25 ms a step on one CPU core per rank: a short step, where a fixed cost per step shows most (a GPU step of
a real model takes 50 ms to seconds)."""
WITHOUT_ENV = "TRAINSTACK_BENCH_WITHOUT"
PARTS = ("comm", "intervals", "series")


def leave_out(part: str) -> None:
    """Patches this rank's trainstack, before its monitor starts, so that `part` (PARTS) does nothing: `comm` the
    DDP communication timing (trainstack/telemetry/comm.py), `intervals` the record cut every 10 steps (one interval
    for the whole run instead), `series` the prometheus series (none). A patch made here, never an option of
    trainstack's."""
    from trainstack.auto.instrument import RANK

    RANK.importing_the_monitor = True  # the automatic layer's own import of the monitor, which it then starts
    import trainstack.monitor as monitor

    if part == "comm":
        monitor.watch_gradient_communication = lambda *args, **kwargs: False
    elif part == "intervals":
        start = monitor.start
        monitor.start = lambda *args, **kwargs: start(*args, **{**kwargs, "log_every": 10**9})
    else:
        monitor.RankMetrics.build = classmethod(lambda cls, *args, **kwargs: cls.off())


def pin_to_local_rank_cpu() -> None:
    """This rank (and the threads it starts: gloo's) on the CPU of its local rank, among the CPUs it may use."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", "0")) % len(cpus)]})


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What rank 0 of a run measured over its steps after the warm-up."""

    steps_per_second: float
    cpu_ms_per_step: float
    """Its loop thread's CPU time a step."""
    process_ms_per_step: float
    """All its threads' (gloo's, the hang responder's)."""
    faults_per_step: float
    """Its loop thread's minor page faults a step."""


def plain_ddp_loop(width: int, batch_size: int, batches: int) -> tuple[Any, Callable[[Any, Any], None]]:
    """The user's loop, nothing of trainstack in it, once the process group is up: a DataLoader of ready batches,
    and the step that trains a DDP MLP `width` wide on one with SGD."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(batch_size, width)
    loader = torch.utils.data.DataLoader([(inputs, inputs.sum(dim=1, keepdim=True))] * batches, batch_size=None)

    def step(batch, targets) -> None:
        loss = torch.nn.functional.mse_loss(model(batch), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return loader, step


def rank_loop(steps: int, out: Path, batch_size: int, width: int) -> None:
    import resource

    import torch.distributed as dist

    pin_to_local_rank_cpu()  # before the group starts gloo's threads
    if part := os.environ.get(WITHOUT_ENV):
        leave_out(part)
    dist.init_process_group("gloo")
    loader, step = plain_ddp_loop(width, batch_size, steps + WARM_UP)
    started = cpu_started = process_started = 0.0
    faults_before = 0
    for index, (batch, targets) in enumerate(loader):
        if index == WARM_UP:
            started, cpu_started, process_started = time.perf_counter(), time.thread_time(), time.process_time()
            faults_before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        step(batch, targets)
    result = RankResult(
        steps / (time.perf_counter() - started),
        (time.thread_time() - cpu_started) * 1000 / steps,  # the loop's thread: not gloo's, not the hang watch's
        (time.process_time() - process_started) * 1000 / steps,
        (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults_before) / steps,
    )
    if dist.get_rank() == 0:
        out.write_text(json.dumps(dataclasses.asdict(result)))
    # Outside the timed steps: gloo's threads let go of the last all-reduce's tensors before the group goes, or a
    # rank may abort as it exits (it did once, in a --no-auto run); an instrumented rank's closing monitor waits so.
    from trainstack.telemetry.future_callbacks import settle_gloo_threads

    settle_gloo_threads(was_on_gloo=True)
    dist.destroy_process_group()


def rank_command(args: argparse.Namespace, out: Path) -> list[str]:
    if args.gpu:
        return [str(Path(__file__).with_name("plain_gpu_loop.py")), "healthy", str(args.steps), str(out)]
    return [__file__, "--rank-loop", str(args.steps), str(out), str(args.batch), str(args.width)]


def watch_command(run_dir: Path, auto: bool, command: list[str]) -> list[str]:
    """`command` watched, its instrumentation on or off, with no exporter to scrape and no report to write."""
    return [
        sys.executable,
        "-m",
        "trainstack",
        "watch",
        "--run-dir",
        str(run_dir),
        "--exporter-port",
        "0",
        "--no-report",
        "--auto" if auto else "--no-auto",
        "--",
        *command,
    ]


def watched(auto: bool, args: argparse.Namespace, scratch: Path) -> tuple[subprocess.Popen, Path]:
    out = scratch / f"{'auto' if auto else 'plain'}-{time.monotonic_ns()}.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1" if args.gpu else "2"]
    command = watch_command(
        scratch / f"run-{out.stem}", auto, [*launch, "--master-port", str(free_port())]
    ) + rank_command(args, out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", WITHOUT_ENV: args.leave_out if auto else ""}
    if args.allocator == "steady":
        env.update(STEADY_ALLOCATOR)
    env.pop(RUN_DIR_ENV, None)
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out


def result_of(process: subprocess.Popen, out: Path) -> RankResult:
    _, errors = process.communicate(timeout=900)
    if process.returncode != 0:
        sys.exit(f"a watched run failed ({process.returncode}): {errors.decode()[-2000:]}")
    return RankResult(**json.loads(out.read_text()))


def run_pair(pair: int, args: argparse.Namespace, scratch: Path) -> tuple[RankResult, RankResult, str]:
    """(the instrumented run's result, the plain run's, which started first)."""
    order = (pair % 2 == 0, pair % 2 == 1)
    first = f"{'auto' if order[0] else '--no-auto'} first"
    results = {}
    if args.gpu:
        for auto in order:
            results[auto] = result_of(*watched(auto, args, scratch))
        return results[True], results[False], f"on the GPU, {first}"
    runs = {auto: watched(auto, args, scratch) for auto in order}
    for auto, run in runs.items():
        results[auto] = result_of(*run)
    return results[True], results[False], f"interleaved, {first}"


def start_up_ms(hooked: bool, scratch: Path) -> float:
    env = {**os.environ, RUN_DIR_ENV: str(scratch / "never-written")}
    if hooked:
        env = instrumented_environment(env)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument(
        "--leave-out", choices=PARTS, default="", metavar="PART", help="PART left out of the instrumented run"
    )
    parser.add_argument(
        "--allocator",
        choices=("glibc", "steady"),
        default="glibc",
        help="glibc's malloc as it comes, or both runs with its heap kept (STEADY_ALLOCATOR)",
    )
    parser.add_argument("--gpu", action="store_true", help="one NCCL rank on a CUDA GPU, runs one after the other")
    parser.add_argument("--rank-loop", nargs=4, metavar=("STEPS", "OUT", "BATCH", "WIDTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leave_out and args.gpu:
        parser.error("--leave-out patches the CPU loop's ranks; the GPU loop (--gpu) runs whole")
    if args.rank_loop:
        steps, out, batch_size, width = args.rank_loop
        rank_loop(int(steps), Path(out), int(batch_size), int(width))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        hooked, plain = [], []
        for start in range(args.starts):  # alternated, the other first every other time
            for hook in (start % 2 == 0, start % 2 == 1):
                (hooked if hook else plain).append(start_up_ms(hook, scratch))
        added = statistics.median(hooked) - statistics.median(plain)
        print(
            f"python -c pass: {statistics.median(hooked):.1f} ms with the start-up hook, "
            f"{statistics.median(plain):.1f} ms without (medians of {args.starts}): +{added:.1f} ms; "
            f"target <= +{START_TARGET_MS:.0f} ms: {'met' if added <= START_TARGET_MS else 'MISSED'}",
            flush=True,
        )
        pairs = []
        for pair in range(args.pairs):
            auto, plain_run, where = run_pair(pair, args, scratch)
            pairs.append((auto, plain_run))
            print(
                f"pair {pair + 1} ({where}): auto {auto.steps_per_second:.3f} steps/s, --no-auto "
                f"{plain_run.steps_per_second:.3f}, ratio {auto.steps_per_second / plain_run.steps_per_second:.3f}; "
                f"rank 0's loop {auto.cpu_ms_per_step:.2f} against {plain_run.cpu_ms_per_step:.2f} ms of CPU and "
                f"{auto.faults_per_step:.0f} against {plain_run.faults_per_step:.0f} page faults a step  "
                f"(load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        name = f"watch (auto, no {args.leave_out})" if args.leave_out else "watch (auto)"
        if args.allocator == "steady":
            name += ", steady allocator"
        print(
            report(
                name,
                "watch --no-auto",
                [auto.steps_per_second for auto, _ in pairs],
                [plain_run.steps_per_second for _, plain_run in pairs],
                None if args.leave_out else STEPS_TARGET,
            )
        )
        for what, field, unit in (
            ("loop thread", "cpu_ms_per_step", "ms of CPU"),
            ("process (all its threads)", "process_ms_per_step", "ms of CPU"),
            ("loop thread", "faults_per_step", "minor page faults"),
        ):
            added = [getattr(auto, field) - getattr(plain_run, field) for auto, plain_run in pairs]
            print(
                f"rank 0's {what}: {statistics.median(added):+.3f} {unit} a step with the instrumentation "
                f"(median of {len(added)} pairs, {min(added):+.3f} to {max(added):+.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
