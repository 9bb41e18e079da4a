"""`trainstack bench scaling --predict`: the ring all-reduce model (train/launcher/scaling/predict.py) on figures
whose answer is known. (Against a real slow link, predicted at 80 Mbit/s from a run at 40 and then measured there:
tests/timing/test_slow_interconnect.py, on its run.)"""

from __future__ import annotations

import pytest

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
