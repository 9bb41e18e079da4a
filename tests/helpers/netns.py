"""Two network namespaces joined by a rate-limited veth pair, and a trainstack node started in each."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.runs import REPO

RATE_BITS = 40_000_000

# What `tc` counts on the link for each byte of an all-reduce's payload: a 1500-byte MTU frame carries 1448 bytes of
# TCP payload (timestamps on) behind 66 bytes of Ethernet, IP and TCP headers. The ACKs for the other way's data
# share the link too, but few: the receiver acknowledges the segments its offload has merged, not each one.
WIRE_BYTES_PER_PAYLOAD_BYTE = (1448 + 66) / 1448


NODE_ADDRESSES = ("10.231.0.1", "10.231.0.2")  # inside this test's namespaces only


EXPORTER_PORT = 9450  # each namespace has its own ports


@dataclass(frozen=True)
class Node:
    namespace: str
    interface: str


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def limit_rate(node: Node, bits: int, action: str = "add") -> subprocess.CompletedProcess:
    """`tc`'s token bucket filter on the node's end of the link at `bits` per second (`action`: add, or change a
    limit already set). Generous latency: a queue that drops makes TCP back off below the rate."""
    return subprocess.run(
        ["ip", "netns", "exec", node.namespace, "tc", "qdisc", action, "dev", node.interface, "root", "tbf"]
        + ["rate", f"{bits // 1_000_000}mbit", "burst", "64kb", "latency", "500ms"],
        capture_output=True,
        text=True,
    )


def start_node(node: Node, rank: int, run_dir: Path, log: Path) -> subprocess.Popen:
    command = [
        "ip",
        "netns",
        "exec",
        node.namespace,
        sys.executable,
        "-m",
        "trainstack",
        "train",
        "--output-dir",
        str(run_dir),
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--nproc-per-node",
        "1",
        "--master-addr",
        NODE_ADDRESSES[0],
        "--master-port",
        "29500",
        "--exporter-port",
        str(EXPORTER_PORT),
        "--max-steps",
        "40",
        "--log-every",
        "2",
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--checkpoint-every",
        "0",
        "--no-report",
    ]
    # One run id: the nodes share the run directory as one run. gloo finds its address from the interface,
    # since the host's name resolves to an address outside the namespace. Both nodes share this machine's cores.
    env = {**os.environ, "TRAINSTACK_RUN_ID": "slow-link", "GLOO_SOCKET_IFNAME": node.interface, "OMP_NUM_THREADS": "1"}
    with log.open("w") as output:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)
