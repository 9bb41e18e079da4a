"""Communication per training step, and how much of it compute did not hide ("exposed"), from marks.

A step's communication is a set of collectives, each from its launch to its end, and a set of waits: places where
compute stops until some of them have ended. The total is the time at least one collective was in flight; the
exposed part is the time compute waited, counted from the point compute reached the wait (its "ready" mark) to the
end of the collectives it waited for, within their flight. On a fast link both differ little; over sockets or
Ethernet the exposed part can be most of the step. trainstack/telemetry/comm.py says where DDP's and FSDP's marks come
from.

The marks are read once per log interval, with the step and data-wait times: no step waits on them.

Which clock: on a CPU rank the host's. On a GPU rank the host runs ahead, so the marks are CUDA events on the
stream the work runs on: a launch on the stream that runs the collective, an end after the collective on a stream
that waits for it, a ready mark on the compute stream. Every figure is measured from a mark taken just before the
step's first one, which all the others follow on the device, so no difference is negative.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from trainstack.telemetry.timeline import TimingEvent

Mark = TypeVar("Mark")


class Clock(Protocol[Mark]):
    def mark(self) -> Mark: ...

    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds from `start` to `end`; both have been reached (see `wait`)."""

    def reached(self, marks: list[Mark]) -> None:
        """Returns once the clock has reached every one of `marks` (a mark may be among them more than once)."""

    def release(self, marks: list[Mark]) -> None:
        """The marks have been read and may be reused (a mark may be among them more than once)."""


class HostClock:
    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self._now = now

    def mark(self) -> float:
        return self._now()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def reached(self, marks: list[float]) -> None:
        pass  # the host's clock has reached every mark taken on it

    def release(self, marks: list[float]) -> None:
        pass


class DeviceClock:
    """Timing events on the current stream, from a pool: a step takes a few per bucket or FSDP unit."""

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

    def reached(self, marks: list[TimingEvent]) -> None:
        for mark in _distinct(marks):
            mark.synchronize()

    def release(self, marks: list[TimingEvent]) -> None:
        with self._lock:
            self._free.extend(_distinct(marks))


def _distinct(marks: list) -> list:
    """Each mark once: a blocking collective's launch is also its wait's ready mark."""
    return list({id(mark): mark for mark in marks}.values())


@dataclass(frozen=True)
class StepComm:
    """One optimizer step's communication."""

    seconds: float
    """The time at least one of the step's collectives was in flight, from its launch to its end."""
    exposed_seconds: float
    """The time compute waited for them (DDP: from the end of backward compute, the last bucket's launch, to the
    end of the last all-reduce)."""
    bytes: int
    """The collectives' sizes: DDP's gradient buckets; FSDP's all-gathered parameters (the gathered size) and
    reduce-scattered gradients (the size before scattering)."""
    buckets: int
    """How many collectives carried them: DDP's buckets (bucket_cap_mb sets their size); FSDP's all-gathers and
    reduce-scatters."""
    forward_exposed_seconds: float = 0.0
    """The part of exposed_seconds whose wait began inside the forward pass (DDP's buffer broadcast, FSDP's
    forward all-gathers): the forward time less it is the rank's own work."""


@dataclass(eq=False, slots=True)  # one collective is itself only: `in` compares identities; made a few times a step
class Collective(Generic[Mark]):
    launched: Mark
    bytes: int
    done: Mark | None = None
    pieces: int = 1
    """How many collectives this one stands for: a DDP step's gradient buckets are timed as one."""


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__, a few times a step
class _Wait(Generic[Mark]):
    ready: Mark
    collectives: list[Collective[Mark]]
    in_forward: bool = False


@dataclass
class _Step(Generic[Mark]):
    origin: Mark
    collectives: list[Collective[Mark]] = field(default_factory=list)
    waits: list[_Wait[Mark]] = field(default_factory=list)
    unwaited: dict[Hashable, list[Collective[Mark]]] = field(default_factory=dict)


class CommTimer(Generic[Mark]):
    """Marks collectives and the waits for them; `step_done` closes a step, `cut` and `read` read the steps.

    Collectives launched under one `group` are waited for together: `waited` (compute reached a mark, then
    waited for the group's collectives launched since its last wait) or `waited_from_launch` (no mark precedes
    the wait, which comes right after the last of them was launched). At the step's end the collectives not waited
    for are waited from the last one's launch: DDP's buckets at the end of backward."""

    def __init__(self, clock: Clock[Mark], in_forward: Callable[[], bool] = lambda: False):
        """`in_forward`: whether the loop is inside a forward pass now, so that a wait that begins there is told
        apart (StepComm.forward_exposed_seconds)."""
        self._clock = clock
        self._in_forward = in_forward
        self._step: _Step[Mark] | None = None
        self._steps: list[_Step[Mark]] = []
        self._closers: list[Callable[[], None]] = []

    @property
    def on_host(self) -> bool:
        """Whether its marks are the host's clock's (HostClock): a CPU rank's."""
        return isinstance(self._clock, HostClock)

    def closing_step(self, closer: Callable[[], None]) -> None:
        """`closer` runs as each step closes, before the step's collectives are counted: a timing that reads its
        marks once a step, after they were taken (DDP's reducer timer, ddp_comm.py), adds them there (`timed`)."""
        self._closers.append(closer)

    def mark(self) -> Mark:
        """A mark on the current stream; the step's first also marks its origin."""
        if self._step is None:
            self._step = _Step(self._clock.mark())
        return self._clock.mark()

    def _open_step(self) -> _Step[Mark]:
        """The step a collective or a wait belongs to: `mark` opened it (a wait's ready mark, a launch's)."""
        assert self._step is not None, "a collective or a wait comes after a mark, which opens the step"
        return self._step

    def launched(
        self, nbytes: int, group: Hashable = None, blocking: bool = False, pieces: int = 1
    ) -> Collective[Mark]:
        """A collective starts; `blocking`: compute waits for it right away, as a CPU rank's host does in gloo's
        blocking collectives; `pieces`: the collectives it stands for."""
        collective = Collective(self.mark(), nbytes, pieces=pieces)
        step = self._open_step()
        step.collectives.append(collective)
        if blocking:
            step.waits.append(_Wait(collective.launched, [collective], self._in_forward()))
        else:
            step.unwaited.setdefault(group, []).append(collective)
        return collective

    def done(self, collective: Collective[Mark]) -> None:
        """The collective has ended (called once the host has it back, or from its future's callback)."""
        collective.done = self._clock.mark()

    def waited(self, ready: Mark, group: Hashable) -> None:
        """Compute reached `ready` (a `mark`), then waited for the group's collectives not yet waited for."""
        step = self._open_step()
        if pending := step.unwaited.pop(group, None):
            step.waits.append(_Wait(ready, pending, self._in_forward()))
        else:
            self._clock.release([ready])

    def timed(self, launched: Mark, ready: Mark, done: Mark, nbytes: int, pieces: int = 1) -> None:
        """A collective timed by others, on the host's clock (HostClock): launched, waited for from `ready` (compute
        reached it, then waited), ended at `done`. The step may open with it: on the host's clock a step's origin
        need not precede its marks."""
        if self._step is None:
            self._step = _Step(launched)
        collective = Collective(launched, nbytes, done, pieces)
        self._step.collectives.append(collective)
        self._step.waits.append(_Wait(ready, [collective]))

    def waited_from_launch(self, group: Hashable) -> None:
        """Compute waited for the group's collectives not yet waited for right after the last one's launch."""
        if self._step and (pending := self._step.unwaited.pop(group, None)):
            self._step.waits.append(_Wait(pending[-1].launched, pending, self._in_forward()))

    def step_done(self) -> None:
        """After the optimizer step: every collective of the step has ended. A micro-batch under DDP's no_sync
        launches none, so its buckets join the step that synchronizes."""
        for closer in self._closers:
            closer()
        step = self._step
        if step is None or not step.collectives:
            return
        if step.unwaited:
            unwaited = [c for group in step.unwaited.values() for c in group]
            pending = [c for c in step.collectives if c in unwaited]
            step.waits.append(_Wait(pending[-1].launched, pending))
            step.unwaited.clear()
        self._steps.append(step)
        self._step = None

    def cut(self) -> list[_Step[Mark]]:
        """The interval's steps, to be read by `read` once the device has run them."""
        steps, self._steps = self._steps, []
        return steps

    def read(self, steps: list[_Step[Mark]]) -> list[StepComm]:
        clock, comms = self._clock, []
        for step in steps:
            marks = list(_marks(step))
            clock.reached(marks)
            origin, nbytes, pieces = step.origin, 0, 0
            flights = {}
            for c in step.collectives:
                flights[id(c)] = (clock.seconds(origin, c.launched), clock.seconds(origin, _ended(c)))
                nbytes += c.bytes
                pieces += c.pieces
            exposed = forward_exposed = 0.0
            for wait in step.waits:
                ready = clock.seconds(origin, wait.ready)
                waited = _covered([(max(ready, flights[id(c)][0]), flights[id(c)][1]) for c in wait.collectives])
                exposed += waited
                if wait.in_forward:
                    forward_exposed += waited
            comms.append(StepComm(_covered(flights.values()), exposed, nbytes, pieces, forward_exposed))
            clock.release(marks)
        return comms


def _ended(collective: Collective[Mark]) -> Mark:
    assert collective.done is not None, "a step is read once closed: every collective of it has ended"
    return collective.done


def _marks(step: _Step) -> Iterable:
    yield step.origin
    for collective in step.collectives:
        yield collective.launched
        yield collective.done
    for wait in step.waits:
        yield wait.ready


def _covered(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of the spans (start, end); a span that ends before it starts is empty."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, reached)
        if end > start:
            total += end - start
            reached = end
    return total
