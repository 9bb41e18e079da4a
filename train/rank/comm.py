"""Gradient communication per step, and how much of it backward compute did not hide ("exposed").

DDP all-reduces the gradients in buckets while backward still computes the earlier layers' gradients: the
reducer launches a bucket once all its gradients are ready, so the last bucket is launched when backward compute
has ended, and `loss.backward()` returns once every bucket's all-reduce is done. The time from the last launch to
the last bucket's end is what the rank waited for the network with nothing left to compute: exposed
communication. On a fast link it is near zero; over sockets or Ethernet it can be most of the step.

The timing comes from a DDP communication hook (`register_comm_hook`, the public route) that wraps DDP's own
all-reduce (`allreduce_hook`, what DDP runs without a hook), marks the clock when the reducer launches a bucket,
and marks it again in the all-reduce future's `then` callback. The marks are read once per log interval, with
the step and data-wait times: no step waits on them and no collective is added. torch's reducer keeps the same
two figures for its own logger (reducer_timer.hpp: backward_comm_time, backward_compute_comm_overlap_time).

Which clock: on a CPU rank (gloo) the host's; the callback runs when the all-reduce has finished. On a GPU rank
the host runs ahead, so the marks are CUDA events: the launch mark on the stream backward computes on (it runs
when the bucket's gradients are computed), the end mark in the callback, which CUDA futures run with current
streams that wait for the all-reduce (so it runs when the all-reduce is done). Every figure is measured from the
step's first launch mark, which all the other marks follow on the device, so no difference is negative.

FSDP (train/rank/sharding.py) has no such public hook for its reduce-scatter: it is not measured, and its
series are absent rather than zero.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch

from trainstack.train.rank.timeline import TimingEvent

# Test-only: seconds each gradient all-reduce is held back after it finishes, as a slow link would. The tests that
# make a run communication-bound set it (tests/test_diagnose.py); nothing else reads it.
TEST_ALLREDUCE_DELAY_ENV = "TRAINSTACK_TEST_ALLREDUCE_DELAY"

Mark = TypeVar("Mark")


class Clock(Protocol[Mark]):
    def mark(self) -> Mark: ...

    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds from `start` to `end`; both have been reached (see `wait`)."""

    def wait(self, mark: Mark) -> None:
        """Returns once the clock has reached `mark`."""

    def release(self, marks: list[Mark]) -> None:
        """The marks have been read and may be reused."""


class HostClock:
    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self._now = now

    def mark(self) -> float:
        return self._now()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def wait(self, mark: float) -> None:
        pass

    def release(self, marks: list[float]) -> None:
        pass


class DeviceClock:
    """Timing events on the current stream, from a pool: a step takes two per bucket."""

    def __init__(self, new_event: Callable[[], TimingEvent]):
        self._new_event = new_event
        self._free: list[TimingEvent] = []
        self._lock = threading.Lock()  # the end marks are taken on the threads that complete the futures

    def mark(self) -> TimingEvent:
        with self._lock:
            event = self._free.pop() if self._free else self._new_event()
        event.record()
        return event

    def seconds(self, start: TimingEvent, end: TimingEvent) -> float:
        return start.elapsed_time(end) / 1000

    def wait(self, mark: TimingEvent) -> None:
        mark.synchronize()

    def release(self, marks: list[TimingEvent]) -> None:
        with self._lock:
            self._free.extend(marks)


@dataclass(frozen=True)
class StepComm:
    """One optimizer step's gradient communication."""

    seconds: float
    """From the first bucket's launch to the end of the last bucket's all-reduce."""
    exposed_seconds: float
    """From the end of backward compute (the last bucket's launch) to the end of the last all-reduce."""
    bytes: int
    """Gradient bytes the rank all-reduced."""
    buckets: int
    """How many all-reduces carried them (DDP's bucket_cap_mb sets the bucket size)."""


@dataclass
class _Bucket(Generic[Mark]):
    launched: Mark
    bytes: int
    done: Mark | None = None


class CommTimer(Generic[Mark]):
    """Marks each bucket's launch and end; `step_done` closes a step's buckets, `interval` reads them."""

    def __init__(self, clock: Clock[Mark]):
        self._clock = clock
        self._buckets: list[_Bucket[Mark]] = []
        self._steps: list[list[_Bucket[Mark]]] = []

    def launched(self, nbytes: int) -> _Bucket[Mark]:
        """The reducer launches a bucket (its gradients are computed)."""
        bucket = _Bucket(self._clock.mark(), nbytes)
        self._buckets.append(bucket)
        return bucket

    def done(self, bucket: _Bucket[Mark]) -> None:
        """The bucket's all-reduce has finished (called from the future's callback)."""
        bucket.done = self._clock.mark()

    def step_done(self) -> None:
        """After the optimizer step: backward has returned, so every bucket of the step has its end mark. A
        micro-batch under no_sync launches none, so its buckets join the step that synchronizes."""
        if self._buckets:
            self._steps.append(self._buckets)
            self._buckets = []

    def cut(self) -> list[list[_Bucket[Mark]]]:
        """The interval's steps, to be read by `read` once the device has run them."""
        steps, self._steps = self._steps, []
        return steps

    def read(self, steps: list[list[_Bucket[Mark]]]) -> list[StepComm]:
        comms = []
        for buckets in steps:
            first = buckets[0].launched
            ends = [bucket.done for bucket in buckets]
            for end in ends:
                self._clock.wait(end)
            compute_end = self._clock.seconds(first, buckets[-1].launched)
            comm_end = max(self._clock.seconds(first, end) for end in ends)
            comms.append(StepComm(seconds=comm_end, exposed_seconds=max(comm_end - compute_end, 0.0),
                                  bytes=sum(bucket.bytes for bucket in buckets), buckets=len(buckets)))
            self._clock.release([mark for bucket in buckets for mark in (bucket.launched, bucket.done)])
        return comms


def timed_allreduce_hook(timer: CommTimer, delay: float = 0.0):
    """DDP's own all-reduce hook with the timer's marks around it; `delay` is the test-only hold-back."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    hold = threading.Lock()  # delays run one after another, as all-reduces on one link do

    def finished(marks, future: torch.futures.Future) -> torch.Tensor:
        if delay:
            with hold:
                time.sleep(delay)
        timer.done(marks)
        return future.value()

    # Unannotated: DDP checks a hook's annotations against its types, and this module's are strings.
    def hook(process_group, bucket):
        buffer = bucket.buffer()
        marks = timer.launched(buffer.numel() * buffer.element_size())
        return allreduce_hook(process_group, bucket).then(lambda future: finished(marks, future))

    return hook


def watch_gradient_communication(model: torch.nn.Module, timer: CommTimer) -> bool:
    """Registers the timed hook on a DDP model; False (nothing registered) for anything else (one process, FSDP)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    delay = float(os.environ.get(TEST_ALLREDUCE_DELAY_ENV, "0"))
    model.register_comm_hook(None, timed_allreduce_hook(timer, delay))
    return True
