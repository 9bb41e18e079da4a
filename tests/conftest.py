"""Shared test helpers: run `trainstack` for real, as a user would, in subprocesses on the CPU; and the guard that
keeps those out of the fast tier unless marked `slow`."""

from __future__ import annotations

import json
import multiprocessing.process
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]  # tests/test_process_guard.py runs a planted test file through the guard below
# Nothing in the suite may reach the network; datasets and the hub are told so before anything imports them.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")

# Small and quick, but still 2 ranks over gloo with loader workers: every rank code path runs.
FAST = ["--batch-size", "8", "--num-workers", "1", "--log-every", "5", "--exporter-port", "0", "--no-report"]


# The fast tier (`make check`: -m "not slow") is every test that starts no process, so a test that starts one
# must say so: without the `slow` mark, every way of starting a process fails the test. Threads stay allowed.
PROCESS_STARTS = [(subprocess.Popen, "_execute_child"), (multiprocessing.process.BaseProcess, "start"),
                  (os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system")]
UNMARKED_PROCESS = "this test starts a process: mark it slow"


@contextmanager
def process_starts_refused(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow"):
        yield
        return
    refused = []

    def refuse(*args, **kwargs):
        refused.append(args)
        pytest.fail(UNMARKED_PROCESS, pytrace=False)

    with pytest.MonkeyPatch.context() as patch:
        for owner, name in PROCESS_STARTS:
            patch.setattr(owner, name, refuse)
        yield
    # Code under test may start its process in a thread, where the raise above ends only that thread.
    if refused:
        pytest.fail(UNMARKED_PROCESS, pytrace=False)


# Setup and teardown too: a fixture that starts a process (cpu_run) counts for the tests that use it.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with process_starts_refused(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with process_starts_refused(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    with process_starts_refused(item):
        return (yield)


def trainstack_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainstack", *args]


def run_trainstack(*args: str, timeout: float = 300, env: dict | None = None,
                   cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(trainstack_command(*args), cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def train(run_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_trainstack("train", "--output-dir", str(run_dir), *FAST, *args, **kwargs)


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


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory) -> Path:
    """One finished 2-rank CPU run of the default model: read it, never write to it."""
    run_dir = tmp_path_factory.mktemp("cpu-run") / "run"
    result = train(run_dir, "--max-steps", "40", "--report")
    assert result.returncode == 0, explain(result)
    return run_dir
