"""Gradient-communication times (trainstack/telemetry/comm_timer.py, with DDP's marks from trainstack/telemetry/comm.py)
from marks on a stand-in clock: the host's (a CPU rank) and the fake GPU of tests/unit/trainstack/test_timeline.py (a
GPU rank, where the host runs ahead of the marks). The figures follow from the schedules by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.fakes import FakeDdpModel, FakeGpu
from trainstack.monitor import Monitor
from trainstack.rundir import METRICS_DIR_ENV, RunDir
from trainstack.telemetry.comm import watch_gradient_communication
from trainstack.telemetry.comm_timer import CommTimer, DeviceClock, HostClock, StepComm
from trainstack.telemetry.device import RankIdentity
from trainstack.telemetry.future_callbacks import FutureCallbacks


class FakeHostClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def one_step(*marks: tuple[float, str, int]) -> list[StepComm]:
    """A step's marks on the host clock: (time, "launch" or "done", bucket); each bucket carries 100 bytes."""
    now = FakeHostClock()
    timer = CommTimer(HostClock(now))
    buckets = {}
    for at, mark, index in marks:
        now.now = at
        if mark == "launch":
            buckets[index] = timer.launched(100)
        else:
            timer.done(buckets[index])
    timer.step_done()
    return timer.read(timer.cut())


def test_host_clock_exposed_is_the_wait_after_the_last_launch():
    # Bucket 0's all-reduce is hidden behind the compute that goes on until bucket 1's launch at 2.0; bucket 1 ends
    # at 2.75: 0.75 s of waiting with nothing left to compute. In flight: 0.5 s, then 0.75 s.
    assert one_step((1.0, "launch", 0), (1.5, "done", 0), (2.0, "launch", 1), (2.75, "done", 1)) == [
        StepComm(seconds=1.25, exposed_seconds=0.75, bytes=200, buckets=2)
    ]


def test_host_clock_takes_the_latest_end_whatever_the_order():
    """gloo may finish an earlier bucket after a later one: the step's communication ends with the latest."""
    assert one_step((0.0, "launch", 0), (0.5, "launch", 1), (0.75, "done", 1), (2.0, "done", 0)) == [
        StepComm(seconds=2.0, exposed_seconds=1.5, bytes=200, buckets=2)
    ]


def test_hidden_communication_is_not_exposed():
    # Bucket 1 ended as it launched: nothing to wait for, nor any time in flight.
    assert one_step((0.0, "launch", 0), (0.25, "done", 0), (1.0, "launch", 1), (1.0, "done", 1)) == [
        StepComm(seconds=0.25, exposed_seconds=0.0, bytes=200, buckets=2)
    ]


def test_steps_and_micro_batches_group_their_buckets():
    """A micro-batch under no_sync launches no bucket: its step_done adds no step; each step is read apart."""
    now = FakeHostClock()
    timer = CommTimer(HostClock(now))
    timer.step_done()  # a step that communicated nothing
    for step in range(3):
        now.now = 10.0 * step
        bucket = timer.launched(8)
        now.now += 0.5 * (step + 1)
        timer.done(bucket)
        timer.step_done()
    steps = timer.read(timer.cut())
    assert [step.exposed_seconds for step in steps] == [0.5, 1.0, 1.5]
    assert timer.cut() == [], "a cut starts the next interval empty"


def test_device_clock_measures_on_the_gpu_timeline_and_reuses_its_events():
    """The host launches both buckets while the GPU is still computing: only the GPU's clock knows when backward
    compute ended (when the stream reached the last launch mark) and when the all-reduce did."""
    gpu = FakeGpu()
    timer = CommTimer(DeviceClock(gpu.new_event))
    for _ in range(2):
        gpu.queue(0.25)  # backward of the last layers
        first = timer.launched(4)
        gpu.queue(0.5)  # backward of the first layers, overlapping bucket 0's all-reduce
        last = timer.launched(4)
        gpu.queue(0.125)  # the last bucket's all-reduce, after compute: the stream's end mark waits for it
        timer.done(first)
        timer.done(last)
        timer.step_done()
    steps = timer.read(timer.cut())
    assert steps == [StepComm(seconds=0.625, exposed_seconds=0.125, bytes=8, buckets=2)] * 2
    assert gpu.events_made == 10, "per step: the origin, and a launch and an end per bucket"
    timer.launched(4)
    assert gpu.events_made == 10, "read marks go back to the pool"


def test_only_a_ddp_model_is_watched():
    timer = CommTimer(HostClock())
    assert not watch_gradient_communication(torch.nn.Linear(2, 2), timer, FutureCallbacks(), training=lambda: True)
    model = FakeDdpModel()
    assert watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    assert len(model.hooks) == 1
    # the buffer broadcast's launch before DDP's forward, its end at the start of the wrapped module's
    assert len(model._forward_pre_hooks) == 1 and len(model.module._forward_pre_hooks) == 1


def test_a_given_hook_runs_inside_the_timing_in_place_of_ddps_all_reduce():
    timer, model, called = CommTimer(HostClock()), FakeDdpModel(), []

    def own_hook(process_group, bucket):  # a user's hook of DDP's kind: its future carries the reduced bucket
        called.append(bucket)
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    assert watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True, comm_hook=own_hook)
    [(_, timed)] = model.hooks  # one hook: DDP takes no second
    bucket = SimpleNamespace(buffer=lambda: torch.ones(10))
    assert torch.equal(timed(None, bucket).wait(), torch.ones(10))
    timer.step_done()
    [step] = timer.read(timer.cut())
    assert called == [bucket] and (step.buckets, step.bytes) == (1, 40)  # an unknown hook: the bucket's bytes


def identity() -> RankIdentity:
    return RankIdentity(
        rank=0,
        local_rank=0,
        node="node0",
        uuid="",
        run_id="comm",
        world_size=2,
        nodes=1,
        mixed_precision="no",
        model="builtin:tiny-gpt",
        dataset="builtin:sequences",
    )


@pytest.mark.parametrize("ddp", [False, True])
def test_the_monitor_records_communication_only_where_measured(tmp_path, monkeypatch, ddp):
    """A DDP rank's records carry the fields (zero in an interval without a synchronizing step); any other rank's
    lack them: unmeasured is absent, not zero."""
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    monitor = Monitor(tmp_path, identity(), flops_per_token=1.0, peak=None, device=torch.device("cpu"))
    assert monitor.watch(FakeDdpModel() if ddp else torch.nn.Linear(2, 2)) == ddp
    monitor.step(8, tokens=64, loss=2.0, lr=1e-3)
    monitor.flush()
    monitor.close()
    record = json.loads(RunDir(tmp_path).rank_records(0).read_text().splitlines()[1])  # after the marker
    fields = {"comm_seconds": 0, "comm_exposed_seconds": 0, "comm_bytes": 0, "comm_buckets": 0}
    assert {key: record[key] for key in fields if key in record} == (fields if ddp else {})
