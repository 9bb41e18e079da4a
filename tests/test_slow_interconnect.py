"""A real slow interconnect (issue 23): two single-rank nodes, each `trainstack train --nnodes 2` in its own network
namespace, joined by a veth pair whose two ends `tc`'s token bucket filter limits to 40 Mbit/s (netem is not
available on these machines; tbf is). Diagnose must say comm-bound, and the exposed share must be what the link's
rate predicts for the gradient bytes the ranks report.

The link is test-local: two namespaces made for this test, a private /30 inside them, deleted afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, explain
from trainstack.rundir import RunDir

pytestmark = pytest.mark.slow

RATE_BITS = 40_000_000
NODE_ADDRESSES = ("10.231.0.1", "10.231.0.2")  # inside this test's namespaces only
EXPORTER_PORT = 9450  # each namespace has its own ports
EXPOSED_SHARE_TOLERANCE = 0.05


@dataclass(frozen=True)
class Node:
    namespace: str
    interface: str


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


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
            if (result := _ip("netns", "add", node.namespace)).returncode:
                pytest.skip(f"cannot make a network namespace: {result.stderr.strip()}")
            made.append(node.namespace)
        steps = [("link", "add", nodes[0].interface, "type", "veth", "peer", "name", nodes[1].interface)]
        for node, address in zip(nodes, NODE_ADDRESSES, strict=True):
            steps += [("link", "set", node.interface, "netns", node.namespace),
                      ("-n", node.namespace, "addr", "add", f"{address}/30", "dev", node.interface),
                      ("-n", node.namespace, "link", "set", "lo", "up"),
                      ("-n", node.namespace, "link", "set", node.interface, "up")]
        for step in steps:
            result = _ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        for node in nodes:
            # Generous latency: a queue that drops makes TCP back off below the rate.
            limited = subprocess.run(["ip", "netns", "exec", node.namespace, "tc", "qdisc", "add", "dev",
                                      node.interface, "root", "tbf", "rate", f"{RATE_BITS // 1_000_000}mbit",
                                      "burst", "64kb", "latency", "500ms"], capture_output=True, text=True)
            if limited.returncode:
                pytest.skip(f"no token bucket filter (sch_tbf): {limited.stderr.strip()}")
        yield nodes
    finally:
        for namespace in made:  # the veth pair goes with them
            _ip("netns", "delete", namespace)


def _start_node(node: Node, rank: int, run_dir: Path, log: Path) -> subprocess.Popen:
    command = ["ip", "netns", "exec", node.namespace, sys.executable, "-m", "trainstack", "train",
               "--output-dir", str(run_dir), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
               "--master-addr", NODE_ADDRESSES[0], "--master-port", "29500", "--exporter-port", str(EXPORTER_PORT),
               "--max-steps", "40", "--log-every", "2", "--batch-size", "8", "--num-workers", "0",
               "--checkpoint-every", "0", "--no-report"]
    # One run id: the nodes share the run directory as one run. gloo finds its address from the interface,
    # since the host's name resolves to an address outside the namespace. Both nodes share this machine's cores.
    env = {**os.environ, "TRAINSTACK_RUN_ID": "slow-link", "GLOO_SOCKET_IFNAME": node.interface,
           "OMP_NUM_THREADS": "1"}
    with log.open("w") as output:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)


def _kill_tree(process: subprocess.Popen) -> None:
    if process.poll() is None:
        for pid in [process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process.wait()


def _comm_records(run_dir: Path, rank: int) -> list[dict]:
    path = RunDir(run_dir).rank_records(rank)
    lines = path.read_text().splitlines() if path.exists() else []
    return [record for line in lines if line.endswith("}") and "comm_seconds" in (record := json.loads(line))]


def test_a_rate_limited_link_is_comm_bound_by_the_share_its_rate_predicts(slow_link, tmp_path):
    run_dir = tmp_path / "run"
    nodes = [_start_node(node, rank, run_dir, tmp_path / f"node-{rank}.log") for rank, node in enumerate(slow_link)]
    try:
        deadline = time.monotonic() + 300
        while len(_comm_records(run_dir, 0)) < 3:  # past the first steps' warm-up
            assert all(node.poll() is None for node in nodes), (tmp_path / "node-0.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no steps within 300 s"
            time.sleep(0.5)
        diagnosed = subprocess.run(
            ["ip", "netns", "exec", slow_link[0].namespace, sys.executable, "-m", "trainstack", "diagnose", "--url",
             f"http://127.0.0.1:{EXPORTER_PORT}", "--interval", "4", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=120)
        for rank, node in enumerate(nodes):
            assert node.wait(timeout=300) == 0, (tmp_path / f"node-{rank}.log").read_text()[-4000:]
    finally:
        for node in nodes:
            _kill_tree(node)
    verdicts = [verdict["kind"] for verdict in json.loads(diagnosed.stdout)["verdicts"]]
    assert verdicts == ["comm-bound"], explain(diagnosed)
    # Each way the link carries 2(n-1)/n of each all-reduce's bytes (a ring: reduce-scatter, then all-gather). The
    # tolerance covers TCP/IP's headers (about 4% at a 1500-byte MTU) and the first bucket's all-reduce, which
    # starts during backward and is partly hidden.
    ranks = 2
    for rank in range(ranks):
        steady = _comm_records(run_dir, rank)[1:]
        steps = sum(len(record["step_seconds"]) for record in steady)
        step_seconds = sum(sum(record["step_seconds"]) for record in steady) / steps
        on_the_wire = 2 * (ranks - 1) / ranks * sum(record["comm_bytes"] for record in steady) / steps
        predicted = on_the_wire / (RATE_BITS / 8) / step_seconds
        exposed = sum(record["comm_exposed_seconds"] for record in steady) / steps / step_seconds
        assert exposed == pytest.approx(predicted, abs=EXPOSED_SHARE_TOLERANCE), (
            f"rank {rank}: exposed {exposed:.3f} of {step_seconds:.3f} s steps, {on_the_wire:.0f} bytes each way "
            f"per step predict {predicted:.3f}")
