"""Times the collectives a rank calls itself, outside DDP's and FSDP's own (trainstack/telemetry/comm.py times
those): a framework's (Lightning's stop-flag broadcast, the Hugging Face Trainer's label-count gather while it
fetches a batch, Accelerate's reductions) or the loop's own (an `all_reduce` of a metric). A fast rank waits there
for a slow one as it does at DDP's all-reduce, so the wait is a wait at the collectives, the straggler's cost.

The `torch.distributed` functions are wrapped while a Monitor runs (torch 2.13 has no public c10d hook that sees a
call as it starts and ends on the caller's stream). A wrapped call is booked only when:
- it blocks: without `async_op`, the host (gloo) or the current stream (NCCL, which makes it wait for the
  collective's stream) waits for it inside the call, so marks on the current stream before and after the call
  (CUDA events on a GPU, as DDP's timing takes) span the wait. An `async_op=True` call is not booked: its wait is
  wherever the loop waits for its Work, which is not seen here.
- its caller is not torch itself, nor trainstack's telemetry: DDP's and FSDP's collectives are timed by their own
  hooks (and trainstack's timed copies of them), and a collective that torch calls inside another
  (`broadcast_object_list`'s `broadcast`) is part of the outer one.
- it runs on the thread the Monitor was started on, the loop's: a helper thread's collective is not the step's.
Nothing else is added to the call: no collective, no synchronization. The wrappers stay once the first Monitor (or,
under `trainstack watch`, torch's import) has put them in place; with no Monitor booking they only pass each call on.
A name the script bound to a collective before then (`from torch.distributed import all_reduce` in a loop
instrumented by hand, imported before `trainstack.monitor.start`) keeps the original: its calls are not seen.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

TIMED = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "gather",
    "scatter",
    "reduce",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)
"""The collectives of `torch.distributed` a loop or a framework calls (point-to-point sends are no collective)."""


@dataclass(frozen=True)
class CollectiveBooking:
    """Where a timed call is booked: `started(nbytes)` before the call (None: not booked, e.g. inside a pause),
    `ended` with what it returned once the call is back."""

    started: Callable[[int], Any | None]
    ended: Callable[[Any], None]


class _Watch:
    booking: CollectiveBooking | None = None
    thread: int | None = None
    originals: dict[str, Callable] = {}


_watch = _Watch()
_inside = threading.local()  # a booked call in progress on this thread: calls within it are part of it


def wrap_collectives() -> None:
    """Puts the wrappers in place of torch.distributed's collectives, once; they only pass each call on until a
    booking watches them. `trainstack watch` calls it as torch is imported, before the script binds a collective
    to a name of its own (`from torch.distributed import all_reduce`), which a wrapper put in place later would
    not reach."""
    if not dist.is_available() or _watch.originals:
        return
    import torch.distributed.distributed_c10d as c10d

    for name in TIMED:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        _watch.originals[name] = original
        wrapped = _timed(original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def watch_collectives(booking: CollectiveBooking) -> Callable[[], None]:
    """Books the collectives this thread calls into `booking` until the returned function is called. One booking at
    a time: a later one replaces an earlier one (a rank runs one Monitor). Where this torch has no
    torch.distributed, there is nothing to book."""
    if not dist.is_available():
        return lambda: None
    wrap_collectives()
    _watch.booking, _watch.thread = booking, threading.get_ident()

    def unwatch() -> None:
        if _watch.booking is booking:
            _watch.booking, _watch.thread = None, None

    return unwatch


def tensor_bytes(args: tuple, kwargs: dict) -> int:
    """A call's size: its largest tensor argument (a list of tensors counts as their sum), which is what the
    collective gathers, scatters or reduces; 0 for objects."""
    sizes = [0]
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            sizes.append(value.numel() * value.element_size())
        elif isinstance(value, list | tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
            sizes.append(sum(v.numel() * v.element_size() for v in value))
    return max(sizes)


def _async_position(function: Callable) -> int | None:
    parameters = list(inspect.signature(function).parameters)
    return parameters.index("async_op") if "async_op" in parameters else None


def _is_async(position: int | None, args: tuple, kwargs: dict) -> bool:
    if "async_op" in kwargs:
        return bool(kwargs["async_op"])
    return position is not None and len(args) > position and bool(args[position])


def _timed_elsewhere(frame: FrameType | None) -> bool:
    """Whether the caller is torch or trainstack's telemetry, whose collectives are timed where they run."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "torch" or name.startswith(("torch.", "trainstack.telemetry."))


def _timed(original: Callable) -> Callable:
    position = _async_position(original)

    @functools.wraps(original)
    def collective(*args, **kwargs):
        booking = _watch.booking
        if (
            booking is None
            or getattr(_inside, "call", False)
            or _watch.thread != threading.get_ident()
            or _is_async(position, args, kwargs)
            or _timed_elsewhere(sys._getframe(1))
        ):
            return original(*args, **kwargs)
        booked = booking.started(tensor_bytes(args, kwargs))
        if booked is None:
            return original(*args, **kwargs)
        _inside.call = True
        try:
            return original(*args, **kwargs)
        finally:
            _inside.call = False
            booking.ended(booked)

    return collective
