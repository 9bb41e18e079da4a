"""Python callbacks on collectives' futures, and the wait, before a rank exits, for the threads that ran them to
let them go.

A gloo collective's future completes on one of gloo's own threads: that thread runs the `then` callbacks, completes
the futures they return (which wakes the loop: FSDP's wait for a collective returns), and only then drops the
callbacks, which needs the GIL. A rank whose loop ends in that window can reach interpreter exit first; the gloo
thread then cannot take the GIL, CPython ends it with pthread_exit, and the unwinding through torch's noexcept
frames calls std::terminate: the rank aborts (SIGABRT, "terminate called without an active exception") after its
last step, and the launch fails. It happened about once in ten runs of examples/ddp_loop.py on 2 CPU ranks, when
DDP's all-reduce was timed by a communication hook's callbacks. NCCL completes its futures on the thread that
launches the collective, so a GPU rank waits for nothing.

The same holds for the tensors of any gloo collective: its thread lets them go a moment after the caller has them
back, and a tensor Python made needs the GIL to go. A rank whose last collective comes right before its exit (the
Hugging Face Trainer all-gathers its FLOP count after the last step) aborts the same way: twice in three runs of
the process tests on the loaded 2-core machine, once nothing else made the closing rank pause (never in 22 runs of
that test alone); and a trainstack trainer rank once, under the same load, its group destroyed before its monitor
closed. Hence `settle_gloo_threads`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

GLOO_SETTLE_SECONDS = 0.05
"""How long a closing gloo rank leaves its collectives' threads to let go of their last tensors: they do within
microseconds of completing a collective, given the GIL."""


class _Held:
    """Lives exactly as long as one callback, which alone refers to it."""


class FutureCallbacks:
    """`then` for the telemetry's callbacks, and `wait_released` for the closing rank."""

    def __init__(self) -> None:
        self._ran: weakref.WeakSet[_Held] = weakref.WeakSet()
        """A token per callback that has run and is still held by the thread that ran it."""

    def then(
        self, future: torch.futures.Future, callback: Callable[[torch.futures.Future], Any]
    ) -> torch.futures.Future:
        """`future.then(callback)`, its release watched."""
        held = _Held()

        def run(done: torch.futures.Future) -> Any:
            try:
                return callback(done)
            finally:
                self._ran.add(held)  # before the future it returns completes, so before the loop can go on

        return future.then(run)

    def wait_released(self, timeout: float = 2.0) -> bool:
        """Waits until every callback that has run has been dropped (True), for at most `timeout` seconds. A
        callback whose collective never ended is not waited for: its thread holds it, but never drops it."""
        deadline = time.monotonic() + timeout
        while self._ran and time.monotonic() < deadline:
            time.sleep(0.001)  # frees the GIL the collective's thread needs to drop it
        return not self._ran


def on_gloo() -> bool:
    """Whether the process's default group is up and runs gloo."""
    return dist.is_available() and dist.is_initialized() and "gloo" in str(dist.get_backend())


def settle_gloo_threads(was_on_gloo: bool = False) -> None:
    """Once, as a rank closes: a pause, on a gloo rank only, in which gloo's threads drop the tensors of its last
    collectives (the module's docstring says why). `was_on_gloo`: the rank ran gloo earlier, and may have destroyed
    its group since (trainstack's trainer does before its monitor closes): its group's threads can outlive that, as
    long as anything refers to the group (a DDP model does)."""
    if was_on_gloo or on_gloo():
        time.sleep(GLOO_SETTLE_SECONDS)
