"""trainstack/telemetry/future_callbacks.py in one process: the wait ends when the completing thread drops the
callback, and a callback that never ran is not waited for (a process that exits first: tests/process/)."""

from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist

from trainstack.telemetry import future_callbacks
from trainstack.telemetry.future_callbacks import FutureCallbacks, settle_gloo_threads


class Payload:
    """Something only the callback refers to."""


def test_the_wait_ends_when_the_completing_thread_drops_the_callback():
    callbacks, gate = FutureCallbacks(), threading.Event()
    payload = Payload()
    alive = weakref.ref(payload)
    parent = torch.futures.Future()
    child = callbacks.then(parent, lambda future, payload=payload: future.value())
    # The completing thread runs the child's callbacks before it drops the parent's, as gloo's thread does.
    child.then(lambda future: gate.wait(30))
    del payload
    threading.Thread(target=parent.set_result, args=(1,), daemon=True).start()
    assert child.wait() == 1  # where DDP's backward returns
    assert alive() is not None and not callbacks.wait_released(timeout=0)  # the thread still holds it
    gate.set()
    assert callbacks.wait_released(timeout=30)
    assert alive() is None


def test_a_callback_that_never_ran_is_not_waited_for():
    callbacks = FutureCallbacks()
    callbacks.then(torch.futures.Future(), lambda future: None)  # a collective that never ends (a hang)
    assert callbacks.wait_released(timeout=0)


def test_only_a_gloo_rank_pauses_for_its_threads_as_it_closes(monkeypatch):
    pauses = []
    monkeypatch.setattr(future_callbacks.time, "sleep", pauses.append)
    settle_gloo_threads()
    assert pauses == [], "no process group: no gloo thread to wait for"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        settle_gloo_threads()
    finally:
        dist.destroy_process_group()
    assert pauses == [future_callbacks.GLOO_SETTLE_SECONDS]


def test_a_monitor_that_saw_gloo_pauses_at_its_close_after_its_group_is_gone(unwatched, tmp_path, monkeypatch):
    """trainstack's trainer destroys its group (Accelerate's end_training) before its monitor closes, and a DDP
    model that refers to the group keeps gloo's threads alive past that: the close settles them all the same."""
    import trainstack.monitor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monitor = trainstack.monitor.start(run_dir=tmp_path)
    finally:
        dist.destroy_process_group()
    pauses = []
    monkeypatch.setattr(future_callbacks.time, "sleep", pauses.append)
    monitor.close()
    assert pauses == [future_callbacks.GLOO_SETTLE_SECONDS]
    settle_gloo_threads(was_on_gloo=False)
    assert len(pauses) == 1, "no group now, none seen: no pause"
