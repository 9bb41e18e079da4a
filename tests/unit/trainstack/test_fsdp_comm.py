"""FSDP2's communication times on a fake GPU with a compute and a communication stream, the times such a schedule
implies worked out by hand (real FSDP2 on two gloo ranks: tests/process/test_fsdp_comm.py)."""

from __future__ import annotations

from tests.helpers.fakes import FakeEvent
from trainstack.telemetry.comm_timer import CommTimer, DeviceClock, StepComm
from trainstack.telemetry.fsdp_comm import REDUCE_SCATTERS


class TwoStreams:
    """tests/unit/trainstack/test_timeline.py's fake GPU with a compute and a communication stream, which run their
    queued work in order while the host has queued everything at time 0; an event takes the time its stream reaches
    it."""

    def __init__(self) -> None:
        self.host = 0.0
        self.synchronized = 0
        self.free = {"compute": 0.0, "comm": 0.0}
        self.current = "compute"

    @property
    def stream_free(self) -> float:
        """When the current stream has run what it has queued (what FakeEvent reads and moves)."""
        return self.free[self.current]

    @stream_free.setter
    def stream_free(self, time: float) -> None:
        self.free[self.current] = time

    def run(self, stream: str, seconds: float) -> None:
        self.free[stream] += seconds

    def wait(self, stream: str, other: str) -> None:
        """`stream` runs nothing more until `other` has run what it has queued (wait_stream, wait_event)."""
        self.free[stream] = max(self.free[stream], self.free[other])

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)


def on_comm_stream(gpu: TwoStreams, call, *args):
    gpu.current = "comm"
    try:
        return call(*args)
    finally:
        gpu.current = "compute"


def test_forward_waits_only_for_the_all_gather_compute_has_not_hidden():
    """Unit 0's all-gather (0.375 s) runs at once and compute waits for all of it; unit 1's runs during unit 0's
    forward (0.25 s) and compute waits only 0.125 s for it."""
    gpu = TwoStreams()
    timer = CommTimer(DeviceClock(gpu.new_event))
    for unit in (0, 1):
        ready = timer.mark()
        gathered = on_comm_stream(gpu, timer.launched, 100, unit)
        gpu.run("comm", 0.375)
        on_comm_stream(gpu, timer.done, gathered)
        timer.waited(ready, unit)
        gpu.wait("compute", "comm")
        gpu.run("compute", 0.25)
    timer.step_done()
    assert timer.read(timer.cut()) == [StepComm(seconds=0.75, exposed_seconds=0.5, bytes=200, buckets=2)]


def test_backward_waits_for_the_previous_reduce_scatter_and_the_last():
    """Unit 1's gradients (0.25 s), then its reduce-scatter (0.5 s) beside unit 0's backward (0.25 s): unit 0's
    post-backward waits 0.25 s for it, and its own reduce-scatter, waited for from its launch, is all exposed."""
    gpu = TwoStreams()
    timer = CommTimer(DeviceClock(gpu.new_event))
    timer.mark()  # the step's forward began at 0
    for unit in (1, 0):
        gpu.run("compute", 0.25)
        if unit == 0:
            timer.waited(timer.mark(), REDUCE_SCATTERS)
            gpu.wait("compute", "comm")
        gpu.wait("comm", "compute")  # the reduce-scatter needs the gradients
        scattered = on_comm_stream(gpu, timer.launched, 100, REDUCE_SCATTERS)
        gpu.run("comm", 0.5)
        on_comm_stream(gpu, timer.done, scattered)
    timer.step_done()
    assert timer.read(timer.cut()) == [StepComm(seconds=1.0, exposed_seconds=0.75, bytes=200, buckets=2)]
