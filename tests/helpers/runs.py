"""Starting `trainstack` as a user would and following it: runs to the end, runs that train until stopped,
watch, the CLI without torch, and the settings of the reference runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers.scrapes import per_rank, scrape
from trainstack.rundir import (
    LEASE_DIR,
    free_port,
)

REPO = Path(__file__).resolve().parents[2]


# Small and quick, but still 2 ranks over gloo with loader workers: every rank code path runs.
FAST = ["--batch-size", "8", "--num-workers", "1", "--log-every", "5", "--exporter-port", "0", "--no-report"]


def trainstack_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainstack", *args]


def torchrun(*args: str, ranks: int = 2) -> list[str]:
    """torchrun with `ranks` processes on a free port of its own: how a user's job starts (under `watch` or alone)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-port",
        str(free_port()),
        *args,
    ]


def accelerate_launch(*args: str, ranks: int = 2) -> list[str]:
    """Accelerate's launcher with `ranks` processes on a free port of its own. --multi_gpu, since `--cpu
    --num_processes 2` starts one process; the ranks run on CPU where ACCELERATE_USE_CPU or no GPU says so."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(ranks),
        "--main_process_port",
        str(free_port()),
        *args,
    ]


def run_trainstack(
    *args: str, timeout: float = 300, env: dict | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainstack_command(*args),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_watched(run_dir: Path, *command: str, flags: tuple[str, ...] = (), **kwargs) -> subprocess.CompletedProcess:
    """`command` under `trainstack watch` until it ends, with no exporter to serve and no report to write; `flags`:
    watch's own (`--no-auto`); `kwargs`: run_trainstack's."""
    return run_trainstack(
        "watch", "--run-dir", str(run_dir), "--exporter-port", "0", "--no-report", *flags, "--", *command, **kwargs
    )


def train(run_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_trainstack("train", "--output-dir", str(run_dir), *FAST, *args, **kwargs)


def tune_two_ranks(
    folder: Path, options: dict, env: dict, rounds: int, steps: int = 10
) -> tuple[subprocess.CompletedProcess, Path]:
    """`trainstack tune` on a 2-rank config of `options` written in `folder`, with `rounds` rounds of `steps`-step
    trials: (its result, the path it writes the winner to)."""
    source = folder / "base.yaml"
    source.write_text(yaml.safe_dump({"batch_size": 8, **options}))
    write = folder / "tuned.yaml"
    rounds_flags = ["--min-rounds", str(rounds), "--max-rounds", str(rounds)]
    result = run_trainstack("tune", str(source), "--write", str(write), "--steps", str(steps), *rounds_flags, env=env)
    assert result.returncode == 0, explain(result)
    return result, write


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def stop_process(process: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM a process the test started, SIGKILL it if it does not exit in time, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(predicate, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until `predicate()` holds; fails with the process's output should it end first, or at `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, process.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.05)


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-8000:]}"


# Constant learning rate: a run stopped at step 7 and continued to the end follows the same schedule as one that
# ran to the end straight (a decaying schedule depends on --max-steps, which the two runs set differently).
EXACT = [
    "--lr-schedule",
    "constant",
    "--warmup-steps",
    "0",
    "--checkpoint-every",
    "0",
    "--batch-size",
    "4",
    "--dataset",
    "tests.factories:indexed_37",
    "--eval-fraction",
    "0",
]
# The uninterrupted runs that interrupted and resumed runs must equal bit for bit, one per configuration: each is
# trained once per session (tests/conftest.py) and read by every test that compares with it. The tiny GPT that can
# pause on a slow rank (the pause changes no number), so the interrupted runs can be slowed enough to stop mid-run.
# DDP's loss logged at every step: its first steps are also DDP's side of the FSDP comparison (test_train_fsdp.py).
REFERENCE_DDP = (*EXACT, "--model", "tests.factories:pausing_gpt", "--log-every", "1")
REFERENCE_DDP_STEPS = 20
# The session's DDP reference also keeps its two newest checkpoints of every 5th step, which the rotation test reads
# (a save draws no random number and changes no weight: every resumed run's bit-equality with it says so).
REFERENCE_DDP_ROTATION = ("--checkpoint-every", "5", "--keep-checkpoints", "2")
# FSDP's units named with --fsdp-wrap, as a factory model needs; the loss logged at every step.
REFERENCE_FSDP = (
    *EXACT,
    "--strategy",
    "fsdp",
    "--model",
    "tests.factories:pausing_gpt",
    "--fsdp-wrap",
    "Block",
    "--log-every",
    "1",
)
REFERENCE_FSDP_STEPS = 12


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def start(run_dir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        trainstack_command("train", "--output-dir", str(run_dir), *FAST, *args),
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def logged_steps(run_dir: Path, rank: int = 0) -> int:
    records = run_dir / "telemetry" / f"rank-{rank}.jsonl"
    lines = records.read_text().splitlines() if records.exists() else []
    # Each launch's first line marks its segment and has no step.
    return max((json.loads(line).get("step", 0) for line in lines if line.endswith("}")), default=0)


SLOW_RANK = {"TRAINSTACK_TEST_SLOW_RANK": "0", "TRAINSTACK_TEST_SLOW_SECONDS": "0.1"}
HEALTHY_RELAUNCHES = 2
"""How many more launches (or windows of a live run) judge a run whose first judgement was off: a healthy run that
got a verdict, or a slowed phase whose straggler or cost read wrong. A 2-vCPU host can take CPU from one rank for a
whole run of a few seconds, even with no other test running (tests/timing/test_watched_matrix.py's healthy
phases: on a quiet host each vCPU's speed moves by up to 25% in episodes of 3-6 s, docs/benchmarks.md), or slow the
peer's own compute through a phase, which no judgement should hide. A wrong judgement the code makes, every launch
makes."""
Judgement = TypeVar("Judgement")


def judged_while_unhealthy(judge: Callable[[], Judgement], healthy: Callable[[Judgement], bool]) -> list[Judgement]:
    """Every judgement made: `judge()` once, then again up to HEALTHY_RELAUNCHES more times while the last is not
    `healthy` (a live run's next window, or another launch)."""
    judged = [judge()]
    while not healthy(judged[-1]) and len(judged) <= HEALTHY_RELAUNCHES:
        judged.append(judge())
    return judged


def checked_while_failing(check: Callable[[], None]) -> list[str]:
    """What each run of `check()` failed with ("" where it held): once, then again up to HEALTHY_RELAUNCHES more
    times while it fails (`check` judges another launch each time it is called)."""

    def failure() -> str:
        try:
            check()
        except AssertionError as failed:
            return str(failed) or "an assertion failed"
        return ""

    return judged_while_unhealthy(failure, lambda failed: failed == "")


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL to a process and every process under it at once, each by PID, then reap it: what a node losing power
    looks like, and the cleanup for a test that failed with them still running."""
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(process.pid)
        for member in [parent, *parent.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
    process.communicate(timeout=30)


@contextlib.contextmanager
def live_run(
    folder: Path, *args: str, env: dict[str, str] | None = None, steps: int = 2, ranks: int = 2
) -> Iterator[str]:
    """A run (2 CPU ranks unless the host has GPUs) that trains until the test ends; yields its exporter's
    /metrics URL once all `ranks` ranks have made `steps` steps. Stopped by killing the launcher and its
    descendants, each by PID. Later `args` override the defaults."""
    port = free_port()
    log_path = folder / "train.log"
    with log_path.open("w") as log:
        launcher = subprocess.Popen(
            trainstack_command(
                "train",
                "--output-dir",
                str(folder / "run"),
                "--max-steps",
                "100000",
                "--exporter-port",
                str(port),
                "--checkpoint-every",
                "0",
                "--log-every",
                "2",
                "--batch-size",
                "8",
                *args,
            ),
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert launcher.poll() is None, f"the run ended early:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no steps within 300 s:\n{log_path.read_text()[-4000:]}"
            with contextlib.suppress(OSError):
                done = per_rank(scrape(url) or []).get("trainstack_train_steps_total", {})
                if len(done) == ranks and min(done.values()) >= steps:
                    break
            time.sleep(0.5)
        yield url
    finally:
        family = [launcher.pid, *(child.pid for child in psutil.Process(launcher.pid).children(recursive=True))]
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()


def start_watch(run_dir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """Watch in a session of its own, as a container's PID 1 or a shell job would be."""
    return subprocess.Popen(
        trainstack_command("watch", "--run-dir", str(run_dir), *args),
        cwd=run_dir.parent,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


# Runs trainstack's CLI with ABSENT unimportable, then prints the exit code and the heavy modules it loaded.
ABSENT = ("torch", "accelerate", "datasets")
WITHOUT_TORCH = f"""
import json, sys
for name in {ABSENT!r}:
    sys.modules[name] = None  # `import torch` now raises ImportError, as where torch is not installed
from trainstack.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
loaded = sorted(m for m in sys.modules if m.partition('.')[0] in {ABSENT!r} and sys.modules[m] is not None)
print(json.dumps({{"exit": code, "loaded": loaded}}))
"""


def run_without_torch(*args: str, timeout: float = 120, **popen) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, **popen
    )
    assert "Traceback" not in result.stderr, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    return {**outcome, "stdout": result.stdout, "stderr": result.stderr}


def file_tree(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under root: its bytes (None for a folder) and modification time. The lease file's time is its
    heartbeat, so it is left out of the times."""
    return {
        str(p.relative_to(root)): (
            None if p.is_dir() else p.read_bytes(),
            0 if p.parent.name == LEASE_DIR else p.stat().st_mtime_ns,
        )
        for p in sorted(root.rglob("*"))
    }
