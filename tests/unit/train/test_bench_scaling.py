"""bench scaling: a real DDP run on 1 and 2 CPU ranks with a table, JSON and a plot; the DataParallel script's
loop on the CPU; the figures and the GPU-host plot from given measurements."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from trainstack.errors import ConfigError
from trainstack.rundir import RunDir
from trainstack.train.launcher.scaling.config import ScalingConfig, default_device_counts
from trainstack.train.launcher.scaling.results import plot, rows, table
from trainstack.train.launcher.scaling.runs import Measurement, exposed_comm_share

GPU_HOST = [
    Measurement("DDP", 1, 100.0),
    Measurement("DDP", 2, 190.0, 0.04),
    Measurement("DDP", 4, 360.0, 0.081),
    Measurement("DataParallel", 1, 98.0),
    Measurement("DataParallel", 2, 150.0),
    Measurement("DataParallel", 4, 200.0),
]


def test_speedup_and_efficiency_are_against_ddp_per_device():
    by_mode = {(r["mode"], r["devices"]): r for r in rows(GPU_HOST)}
    assert by_mode[("DDP", 4)]["speedup"] == pytest.approx(3.6)
    assert by_mode[("DDP", 4)]["efficiency"] == pytest.approx(0.9)
    assert by_mode[("DataParallel", 4)]["efficiency"] == pytest.approx(0.5)
    text = table(GPU_HOST, gpus=4)
    assert "DataParallel          4      200.0     2.00x        50%            -" in text
    assert "DDP                   4      360.0     3.60x        90%           8%" in text
    assert "needs GPUs" not in text


def _interval(time: float, wait: float | None) -> str:
    """A record of two 1 s steps that waited `wait` seconds on communication (None: a rank without it)."""
    fields = {"time": time, "rank": 0, "step": 2, "epoch": 0, "loss": None, "lr": None, "samples": 2, "tokens": 0}
    fields |= {"interval_seconds": 2.0, "data_wait_seconds": 0.0, "step_seconds": [1.0, 1.0]}
    return json.dumps(fields | ({} if wait is None else {"comm_exposed_seconds": wait}))


def test_exposed_share_is_the_least_exposed_ranks(tmp_path):
    """Over each rank's steady window (its steps' times and waits summed past its first record, the warm-up), the
    rank that waited least is the job's figure, as for the comm-bound verdict: a straggler's peers wait for it, it
    does not. A record cut off by a kill and a rank without communication fields (one process) count for
    nothing."""
    layout = RunDir(tmp_path)
    layout.telemetry.mkdir(parents=True)
    for rank, waits in ((0, (1.5, 0.5, 0.25)), (1, (0.0, 0.25, 0.0))):
        lines = [_interval(t, wait) for t, wait in enumerate(waits)]
        layout.rank_records(rank).write_text("\n".join([*lines, '{"time": 9, "step_sec']) + "\n")
    assert exposed_comm_share(tmp_path) == 0.0625
    layout.rank_records(1).write_text("\n".join([_interval(0, None), _interval(1, None)]) + "\n")
    assert exposed_comm_share(tmp_path) == 0.1875
    layout.rank_records(0).write_text("\n".join([_interval(0, None), _interval(1, None)]) + "\n")
    assert exposed_comm_share(tmp_path) is None


def test_gpu_host_plot_has_both_modes(tmp_path):
    plot(GPU_HOST, 4, tmp_path / "scaling.png")
    colours = {colour for _count, colour in Image.open(tmp_path / "scaling.png").convert("RGB").getcolors(1 << 20)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours  # matplotlib's first two lines: DDP, DataParallel


def test_device_counts():
    assert default_device_counts(8) == (1, 2, 4, 8)
    assert default_device_counts(6) == (1, 2, 4, 6)
    assert default_device_counts(1) == (1,)
    assert ScalingConfig(gpus=0).devices == (1, 2)
    with pytest.raises(ConfigError, match="asks for 16 GPUs but this host has 8"):
        ScalingConfig(gpus=8, devices=(1, 16))
    with pytest.raises(ConfigError, match="fp16 needs GPUs"):
        ScalingConfig(gpus=0, mixed_precision="fp16")
