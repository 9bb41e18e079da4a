"""A GPU rank's times on its device's timeline (trainstack/telemetry/clock.py, timeline.py) against a fake GPU: one
stream that runs queued work in order while the host runs ahead, and timing events that take the GPU's time when the
stream reaches them. The loops below are the training loop's order of marks; the figures they must give follow from the fake's schedule by hand."""

from __future__ import annotations

import time

import pytest

from tests.helpers.fakes import FakeGpu
from trainstack.monitor import Monitor
from trainstack.telemetry.clock import GpuRankClock, PendingTimes
from trainstack.telemetry.device import RankIdentity
from trainstack.telemetry.metrics import RankMetrics
from trainstack.telemetry.timeline import IntervalTimes


def train_steps(
    gpu: FakeGpu,
    clock: GpuRankClock,
    loader_seconds: list[float],
    forward: float = 0.02,
    backward: float = 0.04,
    launch: float = 0.0005,
    blocking_copy: bool = False,
) -> list[float]:
    """The loop's marks, one step per loader time; the host spends `launch` seconds queueing each pass.
    Returns the host's time in next() at each step."""
    host_waits = []
    for loader in loader_seconds:
        clock.data_wait_started()
        started = gpu.host
        if blocking_copy:
            gpu.drain()  # Accelerate copies the batch first: a blocking copy waits for the queued steps
        gpu.host_works(loader)
        host_waits.append(gpu.host - started)
        clock.data_ready(gpu.host - started)
        clock.forward_started()
        gpu.host_works(launch)
        gpu.queue(forward)
        clock.forward_done()
        gpu.host_works(launch)
        gpu.queue(backward)
        clock.step_done()
    return host_waits


@pytest.fixture
def gpu() -> FakeGpu:
    return FakeGpu()


def gpu_clock(gpu: FakeGpu) -> GpuRankClock:
    """The clock of a GPU rank on the fake GPU, without NVML's samples and with no series to publish."""
    return GpuRankClock(gpu.new_event, RankMetrics.off(), busy=None, activity=None)


def times_of(pending: PendingTimes) -> IntervalTimes:
    return pending.read()[0]


def test_a_gpu_busy_the_whole_time_never_starves(gpu):
    clock = gpu_clock(gpu)
    train_steps(gpu, clock, [0.003] * 10)  # the loader answers well within a step: the host runs ahead
    gpu.drain()  # the loss reduction's .item()
    times = times_of(clock.cut())
    assert times.data_wait_seconds == pytest.approx(0.003)  # only the first batch, before the GPU had any work
    assert times.step_seconds == pytest.approx([0.003 + 0.0005 + 0.06] + [0.06] * 9)
    assert times.forward_seconds == pytest.approx(0.0005 + 10 * 0.02)


def test_a_gpu_idle_while_the_loader_is_slow_starves_for_the_difference(gpu):
    clock = gpu_clock(gpu)
    # A batch takes 0.1 s; a step is 0.06 s of GPU work queued over 0.001 s. In its stride the host takes
    # 0.101 s a step and the GPU is done 0.0605 s after the batch came: it waits 0.0405 s for the next one.
    train_steps(gpu, clock, [0.1] * 20)
    gpu.drain()
    times = times_of(clock.cut())
    assert times.step_seconds == pytest.approx([0.1 + 0.0005 + 0.06] + [0.101] * 19)
    assert times.data_wait_seconds == pytest.approx(0.1 + 19 * 0.0405)  # the first wait: idle from the start
    share = times.data_wait_seconds / sum(times.step_seconds)
    fast_step = 0.06  # the same steps with a quick loader (above): all GPU work, back to back
    assert share == pytest.approx(1 - fast_step / 0.101, abs=0.02)


def test_a_mixture_counts_only_the_waits_the_gpu_could_not_hide(gpu):
    clock = gpu_clock(gpu)
    train_steps(gpu, clock, [0.003] * 5)  # the host gets ahead: ~0.28 s of queued work
    ahead = gpu.stream_free - gpu.host
    train_steps(gpu, clock, [0.4])  # one slow batch: the queue covers all but `0.4 - ahead` of it
    train_steps(gpu, clock, [0.003] * 4)
    gpu.drain()
    times = times_of(clock.cut())
    assert 0.2 < ahead < 0.4
    assert times.data_wait_seconds == pytest.approx(0.003 + 0.4 - ahead)
    assert len(times.step_seconds) == 10


def test_a_blocking_copy_makes_the_host_wait_but_the_gpu_does_not_starve(gpu):
    """The run of the issue: the host sits in next() while the copy waits for the queue; the GPU keeps busy."""
    clock = gpu_clock(gpu)
    host_waits = train_steps(gpu, clock, [0.0005] * 20, blocking_copy=True)
    gpu.drain()
    times = times_of(clock.cut())
    assert sum(host_waits[1:]) / sum(times.step_seconds[1:]) > 0.9  # what the host's clock says
    assert times.data_wait_seconds / sum(times.step_seconds) < 0.02  # what the GPU's says


def test_intervals_read_only_their_own_steps_and_reuse_the_events(gpu):
    clock = gpu_clock(gpu)
    intervals = []
    for _ in range(30):
        train_steps(gpu, clock, [0.1, 0.003, 0.003])
        gpu.drain()
        intervals.append(times_of(clock.cut()))
    assert all(len(t.step_seconds) == 3 for t in intervals)
    # the step that straddles a read still counts from the previous step's end
    assert intervals[5].step_seconds[0] == pytest.approx(0.1 + 0.0005 + 0.06)
    assert gpu.events_made <= 5 * 3 + 2  # a pool: one interval's worth of events, not one set per step
    assert gpu.synchronized == 30  # one wait per read, on the newest event; none per step


@pytest.mark.parametrize("read_late", [True, False])
def test_an_interval_read_after_the_next_step_is_queued_leaves_the_gpu_working(gpu, read_late):
    """The loop's order (train/rank/trainer.py): cut at the interval's end, queue the next step, then read. Reading
    at once drains the GPU, which then idles while the host logs (here 5 ms) and queues again."""
    clock = gpu_clock(gpu)
    logging = 0.005
    train_steps(gpu, clock, [0.003] * 3)
    spans = clock.cut()
    if read_late:
        train_steps(gpu, clock, [0.003])
    first = times_of(spans)
    assert len(first.step_seconds) == 3
    assert (gpu.stream_free > gpu.host) is read_late  # the late read waited for step 3 only; step 4 still runs
    gpu.host_works(logging)
    train_steps(gpu, clock, [0.003] * (2 if read_late else 3))
    gpu.drain()
    second = times_of(clock.cut())
    assert len(second.step_seconds) == 3  # steps 4-6, step 4 from the end of step 3
    idle = 0.003 + 0.0005 + logging  # the batch, the launch and the logging, with nothing queued
    assert second.step_seconds[0] == pytest.approx(0.06 if read_late else 0.06 + idle)
    assert second.step_seconds[1:] == pytest.approx([0.06] * 2)


def test_a_pause_between_steps_is_not_a_step(gpu):
    clock = gpu_clock(gpu)
    train_steps(gpu, clock, [0.003] * 2)
    gpu.drain()
    gpu.host_works(5.0)  # a checkpoint
    clock.restart_step_clock()
    train_steps(gpu, clock, [0.003])
    gpu.drain()
    times = times_of(clock.cut())
    assert times.step_seconds[-1] == pytest.approx(0.003 + 0.0005 + 0.06)


def test_cpu_telemetry_counts_the_host_wait_as_data_wait(tmp_path, monkeypatch):
    """On a CPU rank the host's clock is the right one: both counters get the same time, and the record says so."""
    import json

    import torch

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    identity = RankIdentity(
        rank=0,
        local_rank=0,
        node="n",
        uuid="",
        run_id="r",
        world_size=1,
        nodes=1,
        mixed_precision="no",
        model="m",
        dataset="d",
    )
    monitor = Monitor(tmp_path, identity, 1.0, None, torch.device("cpu"))
    monitor.data_wait_started()
    time.sleep(0.05)
    monitor.data_ready()
    monitor.step(4, loss=2.0, lr=0.1, tokens=40)
    monitor.flush()
    share = monitor.data_wait_share
    monitor.close()
    record = json.loads((tmp_path / "telemetry" / "rank-0.jsonl").read_text().splitlines()[1])  # after the marker
    assert record["clock"] == "host" and monitor.clock == "host"
    assert record["data_wait_seconds"] == record["host_data_wait_seconds"] >= 0.05
    assert share == pytest.approx(record["data_wait_seconds"] / sum(record["step_seconds"]))


def test_gpu_telemetry_records_the_gpus_starvation_and_the_hosts_wait_apart(tmp_path, monkeypatch, gpu):
    """The monitor's CUDA path with the fake GPU's events: the host sleeps in next() while the GPU has work."""
    import json

    import torch

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: gpu.new_event())
    identity = RankIdentity(
        rank=0,
        local_rank=0,
        node="n",
        uuid="GPU-0",
        run_id="r",
        world_size=1,
        nodes=1,
        mixed_precision="bf16",
        model="m",
        dataset="d",
    )
    monitor = Monitor(tmp_path, identity, 1.0, None, torch.device("cuda"), log_every=1000)
    monitor.resumed_at(1)  # none of these steps is a run's first, which is an interval of its own
    gpu.queue(0.5)  # work queued before the loop: the GPU is busy throughout
    for _ in range(3):
        monitor.data_wait_started()
        time.sleep(0.02)
        monitor.data_ready()
        monitor.forward_started()
        gpu.queue(0.05)
        monitor.forward_done()
        gpu.queue(0.1)
        monitor.step(16, loss=2.0, lr=0.1, tokens=16 * 1024)
    gpu.drain()
    monitor.flush()
    share = monitor.data_wait_share
    monitor.close()
    record = json.loads((tmp_path / "telemetry" / "rank-0.jsonl").read_text().splitlines()[1])  # after the marker
    assert record["clock"] == "gpu" and monitor.clock == "gpu"
    assert record["data_wait_seconds"] == 0 and share == 0
    assert record["host_data_wait_seconds"] >= 3 * 0.02
    assert record["step_seconds"] == pytest.approx([0.5 + 0.15, 0.15, 0.15])
