"""A real slow interconnect (issue 23): two single-rank nodes, each `trainstack train --nnodes 2` in its own network
namespace, joined by a veth pair whose two ends `tc`'s token bucket filter limits to 40 Mbit/s (netem is not
available on these machines; tbf is). Diagnose must say comm-bound, and the exposed share must be what the link's
rate predicts for the gradient bytes the ranks report. Then `bench scaling --predict`'s ring model
(train/launcher/scaling/predict.py), given that run's figures, must predict the step measured on the link at twice
the rate.

The link is test-local: two namespaces made for this test, a private /30 inside them, deleted afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.netns import EXPORTER_PORT, RATE_BITS, WIRE_BYTES_PER_PAYLOAD_BYTE, Node, limit_rate, start_node
from tests.helpers.runs import REPO, explain, kill_tree
from trainstack.rundir import RunDir
from trainstack.train.launcher.scaling import predict

pytestmark = [pytest.mark.slow, pytest.mark.timing]

# Below the prediction by more than above it: what the link's rate predicts is the whole all-reduce, and only the
# part backward does not hide is exposed (the first bucket's, which starts during backward). Measured: 0.025-0.033
# below in five runs on this machine, 0.053 below once on a fresh clone in a busier hour (docs/benchmarks.md).
EXPOSED_SHARE_ABOVE = 0.05
EXPOSED_SHARE_BELOW = 0.08
PREDICTED_STEP_TOLERANCE = 0.15


def _comm_records(run_dir: Path, rank: int) -> list[dict]:
    path = RunDir(run_dir).rank_records(rank)
    lines = path.read_text().splitlines() if path.exists() else []
    return [record for line in lines if line.endswith("}") and "comm_seconds" in (record := json.loads(line))]


def _run_on(nodes: tuple[Node, Node], run_dir: Path, tmp_path: Path) -> None:
    started = [
        start_node(node, rank, run_dir, tmp_path / f"{run_dir.name}-{rank}.log") for rank, node in enumerate(nodes)
    ]
    try:
        for rank, node in enumerate(started):
            assert node.wait(timeout=300) == 0, (tmp_path / f"{run_dir.name}-{rank}.log").read_text()[-4000:]
    finally:
        for node in started:
            kill_tree(node)


def test_a_rate_limited_link_is_comm_bound_by_the_share_its_rate_predicts_and_the_step_at_twice_the_rate(
    slow_link, tmp_path
):
    run_dir = tmp_path / "run"
    nodes = [start_node(node, rank, run_dir, tmp_path / f"node-{rank}.log") for rank, node in enumerate(slow_link)]
    try:
        deadline = time.monotonic() + 300
        while len(_comm_records(run_dir, 0)) < 3:  # past the first steps' warm-up
            assert all(node.poll() is None for node in nodes), (tmp_path / "node-0.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no steps within 300 s"
            time.sleep(0.5)
        diagnosed = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                slow_link[0].namespace,
                sys.executable,
                "-m",
                "trainstack",
                "diagnose",
                "--url",
                f"http://127.0.0.1:{EXPORTER_PORT}",
                "--interval",
                "4",
                "--json",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for rank, node in enumerate(nodes):
            assert node.wait(timeout=300) == 0, (tmp_path / f"node-{rank}.log").read_text()[-4000:]
    finally:
        for node in nodes:
            kill_tree(node)
    verdicts = [verdict["kind"] for verdict in json.loads(diagnosed.stdout)["verdicts"]]
    assert verdicts == ["comm-bound"], explain(diagnosed)
    # Each way the link carries 2(n-1)/n of each all-reduce's bytes (a ring: reduce-scatter, then all-gather), and
    # its frames' headers on top (without them the prediction fell 0.02-0.05 short, once past the tolerance). The
    # tolerance covers the first bucket's all-reduce, which starts during backward and is partly hidden, and noise.
    ranks = 2
    for rank in range(ranks):
        steady = _comm_records(run_dir, rank)[1:]
        steps = sum(len(record["step_seconds"]) for record in steady)
        step_seconds = sum(sum(record["step_seconds"]) for record in steady) / steps
        payload = 2 * (ranks - 1) / ranks * sum(record["comm_bytes"] for record in steady) / steps
        on_the_wire = payload * WIRE_BYTES_PER_PAYLOAD_BYTE
        predicted = on_the_wire / (RATE_BITS / 8) / step_seconds
        exposed = sum(record["comm_exposed_seconds"] for record in steady) / steps / step_seconds
        assert predicted - EXPOSED_SHARE_BELOW <= exposed <= predicted + EXPOSED_SHARE_ABOVE, (
            f"rank {rank}: exposed {exposed:.3f} of {step_seconds:.3f} s steps, {on_the_wire:.0f} bytes each way "
            f"per step predict {predicted:.3f}"
        )

    # The same run at twice the rate, against the ring model's prediction from the run above.
    faster = 2 * RATE_BITS
    for node in slow_link:
        changed = limit_rate(node, faster, "change")
        assert changed.returncode == 0, changed.stderr
    fast = tmp_path / "fast"
    _run_on(slow_link, fast, tmp_path)
    measured = predict.figures_of(run_dir)
    # The link's own rate, less what its frames' headers take of it, as the bus bandwidth.
    predicted = predict.predict(measured, 2, bus_bytes_per_second=faster / 8 / WIRE_BYTES_PER_PAYLOAD_BYTE)
    actual = predict.figures_of(fast)
    assert predicted.step_seconds == pytest.approx(
        actual.compute_seconds + actual.exposed_seconds, rel=PREDICTED_STEP_TOLERANCE
    ), (measured, actual, predicted)
