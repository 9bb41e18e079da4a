"""The guard that keeps tests that start a process out of the fast tier unless marked `slow`, and the fixtures
shared by more than one test module (their helpers live in tests/helpers/)."""

from __future__ import annotations

import multiprocessing.process
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml
from filelock import FileLock

import trainstack.monitoring.nvml_fake as nvml_fake
from tests.helpers import module_order
from tests.helpers.netns import NODE_ADDRESSES, RATE_BITS, Node, ip, limit_rate
from tests.helpers.nvml_fake import HOST
from tests.helpers.runs import (
    REFERENCE_DDP,
    REFERENCE_DDP_ROTATION,
    REFERENCE_DDP_STEPS,
    REFERENCE_FSDP,
    REFERENCE_FSDP_STEPS,
    explain,
    train,
)
from trainstack.rundir import LAUNCHED_AT_ENV, LOG_EVERY_ENV, METRICS_DIR_ENV, RUN_DIR_ENV, free_port

pytest_plugins = ["pytester"]  # tests/unit/repo/test_process_guard.py runs a planted test file through the guard below
# Nothing in the suite may reach the network; datasets and the hub are told so before anything imports them.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")
# The launcher takes a Slurm job's world where one is in the environment (trainstack/slurm.py): a suite run inside a
# Slurm job, as on a cluster's CI runner, would have every launch in the tests take that job's nodes and ports.
for _name in [name for name in os.environ if name.startswith(("SLURM_", "SLURMD_"))]:
    del os.environ[_name]


# The fast tier (`make check`: -m "not slow") is every test that starts no process, so a test that starts one
# must say so: without the `slow` mark, every way of starting a process fails the test. Threads stay allowed.
PROCESS_STARTS = [
    (subprocess.Popen, "_execute_child"),
    (multiprocessing.process.BaseProcess, "start"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
]
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


NEEDS_GPU = re.compile(r"\bneeds\b.*\bGPUs?\b")  # a skip reason that says so: "needs a CUDA GPU", "needs 2 GPUs"
GPU_UNMARKED = "skipped without a GPU but not marked gpu, so `pytest -m gpu` on a GPU machine leaves it out"


def gpu_unmarked(item: pytest.Item) -> bool:
    """Skipped for want of a GPU without the `gpu` mark: the GPU run (`-m gpu`, docs/benchmarks.md) would leave it
    out, and nothing would say so. Such a test fails, wherever it runs, before its skip is looked at."""
    return not item.get_closest_marker("gpu") and any(
        NEEDS_GPU.search(str(mark.kwargs.get("reason", ""))) for mark in item.iter_markers("skipif")
    )


# Every test this session collected, before -m and -k deselect any: tests/unit/repo/test_suite_layout.py checks each
# one's folder against its marks, including the tests the fast tier leaves out.
COLLECTED = pytest.StashKey[list[pytest.Item]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[COLLECTED] = list(items)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its collection is the order the modules go out in
        items[:] = module_order.longest_first(items, module_order.read_seconds())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-module-seconds",
        action="store_true",
        help=f"write each module's seconds in this run into {module_order.MODULE_SECONDS.name} (tests/helpers/module_order.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_module_seconds") and os.environ.get("PYTEST_XDIST_WORKER") is None:
        config.pluginmanager.register(module_order.SecondsRecorder(), "module-seconds-recorder")


# Setup and teardown too: a fixture that starts a process (cpu_run) counts for the tests that use it.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if gpu_unmarked(item):
        pytest.fail(GPU_UNMARKED, pytrace=False)
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


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory) -> Path:
    """One finished 2-rank CPU run of the default model: read it, never write to it."""
    return finished_run(tmp_path_factory, "cpu-run", "--max-steps", "40", "--report")


def finished_run(tmp_path_factory, name: str, *args: str) -> Path:
    """A run of `args` trained to its end, once per session: under pytest-xdist (`make test`) the first worker to
    need it trains it, in the temporary root all workers share, and the others wait for it and read it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _train_to_end(tmp_path_factory.mktemp(name) / "run", args)
    shared = tmp_path_factory.getbasetemp().parent  # the session's root; each worker's basetemp is inside it
    with FileLock(shared / f"{name}.lock"):
        run_dir = shared / name / "run"
        trained = shared / name / "trained"
        if not trained.exists():
            shutil.rmtree(run_dir.parent, ignore_errors=True)  # an earlier worker's attempt that failed
            run_dir.parent.mkdir()
            _train_to_end(run_dir, args)
            trained.touch()
    return run_dir


def _train_to_end(run_dir: Path, args: tuple[str, ...]) -> Path:
    result = train(run_dir, *args)
    assert result.returncode == 0, explain(result)
    return run_dir


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory) -> Path:
    """REFERENCE_DDP trained straight to REFERENCE_DDP_STEPS, with REFERENCE_DDP_ROTATION's checkpoints: read it,
    never write to it."""
    steps = ("--max-steps", str(REFERENCE_DDP_STEPS))
    return finished_run(tmp_path_factory, "ddp-reference", *REFERENCE_DDP, *steps, *REFERENCE_DDP_ROTATION)


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory) -> Path:
    """REFERENCE_FSDP trained straight to REFERENCE_FSDP_STEPS: read it, never write to it."""
    return finished_run(tmp_path_factory, "fsdp-reference", *REFERENCE_FSDP, "--max-steps", str(REFERENCE_FSDP_STEPS))


@pytest.fixture
def prometheus(tmp_path) -> Iterator[callable]:
    """A function that starts Debian's Prometheus on loopback, scraping one target every second."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found: install Debian's `prometheus` package (make system-deps)")
    started: list[subprocess.Popen] = []

    def start(target: str) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [{"job_name": "trainstack", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        log = (tmp_path / "prometheus.log").open("w")
        started.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def unwatched(monkeypatch):
    """Outside a watched run: no run directory, no metrics directory, no rank of a launcher's."""
    for name in (RUN_DIR_ENV, METRICS_DIR_ENV, LOG_EVERY_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def plain_env(monkeypatch):
    """No metrics directory; the launch 2 s ago."""
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    launched = time.time() - 2.0
    monkeypatch.setenv(LAUNCHED_AT_ENV, repr(launched))
    return launched


@pytest.fixture
def slow_link() -> Iterator[tuple[Node, Node]]:
    """Two namespaces joined by a veth pair limited to RATE_BITS in each direction; skips where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("no `ip` or `tc` on PATH (iproute2)")
    tag = f"{os.getpid()}"
    nodes = (Node(f"ts{tag}-a", f"tv{tag}a"), Node(f"ts{tag}-b", f"tv{tag}b"))
    made = []
    try:
        for node in nodes:
            if (result := ip("netns", "add", node.namespace)).returncode:
                pytest.skip(f"cannot make a network namespace: {result.stderr.strip()}")
            made.append(node.namespace)
        steps = [("link", "add", nodes[0].interface, "type", "veth", "peer", "name", nodes[1].interface)]
        for node, address in zip(nodes, NODE_ADDRESSES, strict=True):
            steps += [
                ("link", "set", node.interface, "netns", node.namespace),
                ("-n", node.namespace, "addr", "add", f"{address}/30", "dev", node.interface),
                ("-n", node.namespace, "link", "set", "lo", "up"),
                ("-n", node.namespace, "link", "set", node.interface, "up"),
            ]
        for step in steps:
            result = ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        for node in nodes:
            limited = limit_rate(node, RATE_BITS)
            if limited.returncode:
                pytest.skip(f"no token bucket filter (sch_tbf): {limited.stderr.strip()}")
        yield nodes
    finally:
        for namespace in made:  # the veth pair goes with them
            ip("netns", "delete", namespace)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def watched_gpu():
    """GPU 0 of the NVML fake's HOST, whose watched job's entry stands for the process that asks."""
    nvml_fake.load(HOST)
    nvml_fake.nvmlInit()
    yield nvml_fake.nvmlDeviceGetHandleByIndex(0)
    nvml_fake.load(None)
