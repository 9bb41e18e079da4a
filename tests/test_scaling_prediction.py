"""`trainstack bench scaling --predict`: the ring all-reduce model (train/launcher/scaling/predict.py) on figures
whose answer is known, and against a real slow link: two single-rank nodes in network namespaces (as
tests/test_slow_interconnect.py builds them) at 40 Mbit/s, predicted at 80 Mbit/s, then measured there."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers.netns import RATE_BITS, start_node
from tests.helpers.runs import kill_tree, run_trainstack
from trainstack.train.launcher.scaling import predict
from trainstack.train.launcher.scaling.predict import RunFigures

TOLERANCE = 0.15


def test_the_ring_model_on_known_figures():
    # 2 ranks, 100 MB of gradients over 1 GB/s bus bandwidth: 100 ms of communication, half of it hidden.
    run = RunFigures(world_size=2, compute_seconds=0.2, comm_seconds=0.1, exposed_seconds=0.05, gradient_bytes=1e8)
    assert run.bus_bytes_per_second == pytest.approx(1e9)
    same = predict.predict(run, 2)
    assert same.step_seconds == pytest.approx(0.25)
    eight = predict.predict(run, 8, bus_bytes_per_second=2e9)  # 2 x 7/8 x 100 MB / 2 GB/s = 87.5 ms, half exposed
    assert eight.step_seconds == pytest.approx(0.2 + 0.04375)
    assert eight.efficiency == pytest.approx(0.2 / 0.24375)
    assert predict.predict(run, 1).efficiency == 1.0


def test_a_run_without_communication_is_refused_in_one_line(tmp_path):
    with pytest.raises(Exception, match="no gradient communication"):
        RunFigures(world_size=1, compute_seconds=0.2, comm_seconds=0.0, exposed_seconds=0.0, gradient_bytes=0.0)


@pytest.mark.slow
def test_bad_input_exits_2(tmp_path):
    result = run_trainstack("bench", "scaling", "--predict", str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def _run_on(nodes, run_dir, tmp_path) -> None:
    started = [
        start_node(node, rank, run_dir, tmp_path / f"{run_dir.name}-{rank}.log") for rank, node in enumerate(nodes)
    ]
    try:
        for rank, node in enumerate(started):
            assert node.wait(timeout=300) == 0, (tmp_path / f"{run_dir.name}-{rank}.log").read_text()[-4000:]
    finally:
        for node in started:
            kill_tree(node)


@pytest.mark.slow
@pytest.mark.timing
def test_the_prediction_at_another_link_speed_matches_the_measured_step(slow_link, tmp_path):
    slow = tmp_path / "slow"
    _run_on(slow_link, slow, tmp_path)
    faster = 2 * RATE_BITS
    for node in slow_link:
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                node.namespace,
                "tc",
                "qdisc",
                "change",
                "dev",
                node.interface,
                "root",
                "tbf",
                "rate",
                f"{faster // 1_000_000}mbit",
                "burst",
                "64kb",
                "latency",
                "500ms",
            ],
            check=True,
        )
    fast = tmp_path / "fast"
    _run_on(slow_link, fast, tmp_path)
    measured = predict.figures_of(slow)
    # The link's own rate, less TCP/IP's headers (about 4% at a 1500-byte MTU), as the bus bandwidth.
    predicted = predict.predict(measured, 2, bus_bytes_per_second=faster / 8 * 0.96)
    actual = predict.figures_of(fast)
    assert predicted.step_seconds == pytest.approx(actual.compute_seconds + actual.exposed_seconds, rel=TOLERANCE), (
        measured,
        actual,
        predicted,
    )
