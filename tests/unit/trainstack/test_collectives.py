"""The collectives a loop or a framework calls itself (trainstack/telemetry/collectives.py), and how a Monitor books
them: a wait at the collectives, never a wait for data or forward time. A stand-in collective that sleeps is what a
fast rank's blocking call does while it waits for a slow peer; with 2 real ranks it is tested in
tests/timing/test_user_collectives.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

import trainstack.monitor
from tests.helpers.fakes import FakeGpu, identity
from trainstack.monitor import Monitor
from trainstack.rundir import RunDir, read_json_lines
from trainstack.telemetry import collectives
from trainstack.telemetry.collectives import CollectiveBooking, tensor_bytes, watch_collectives
from trainstack.telemetry.gpu_activity import GpuActivity
from trainstack.telemetry.gpu_busy import GpuBusy

WAIT = 0.05


def all_reduce(tensor, op=None, group=None, async_op=False):
    """A stand-in with all_reduce's parameters: blocks WAIT seconds unless async."""
    if not async_op:
        time.sleep(WAIT)


timed_all_reduce = collectives._timed(all_reduce)


@pytest.fixture
def booked():
    calls: list[int] = []
    unwatch = watch_collectives(CollectiveBooking(lambda nbytes: calls.append(nbytes) or nbytes, lambda b: None))
    yield calls
    unwatch()


def test_a_blocking_call_is_booked_with_its_largest_tensors_bytes(booked):
    timed_all_reduce(torch.ones(4))
    assert booked == [16]
    assert tensor_bytes(([torch.ones(2), torch.ones(2)], torch.ones(1)), {}) == 16  # all_gather's list: gathered
    assert tensor_bytes(([None],), {"obj": 3}) == 0  # an object collective


def test_an_async_call_is_not_booked_whether_async_op_is_named_or_placed(booked):
    timed_all_reduce(torch.ones(4), async_op=True)
    timed_all_reduce(torch.ones(4), None, None, True)
    assert booked == []


def test_torchs_and_the_telemetrys_own_calls_and_calls_within_a_booked_one_are_not_booked(booked):
    # DDP's and FSDP's collectives are timed by their hooks; broadcast_object_list's broadcast is part of it.
    exec(
        "timed(torch.ones(4))", {"__name__": "torch.nn.parallel.distributed", "timed": timed_all_reduce, "torch": torch}
    )
    # trainstack's timed copies of FSDP's collectives are booked where they run (trainstack/telemetry/fsdp_comm.py)
    exec(
        "timed(torch.ones(4))",
        {"__name__": "trainstack.telemetry.fsdp_comm", "timed": timed_all_reduce, "torch": torch},
    )
    outer = collectives._timed(lambda tensor, async_op=False: timed_all_reduce(tensor))
    outer(torch.ones(2))
    assert booked == [8]


def test_another_threads_call_is_not_the_loops(booked):
    thread = threading.Thread(target=timed_all_reduce, args=(torch.ones(4),))
    thread.start()
    thread.join()
    assert booked == []


def test_after_unwatching_nothing_is_booked():
    calls: list[int] = []
    unwatch = watch_collectives(CollectiveBooking(calls.append, lambda b: None))
    unwatch()
    timed_all_reduce(torch.ones(4))
    assert calls == []


def test_the_torch_distributed_functions_are_the_timed_ones_while_a_monitor_runs(booked):
    assert torch.distributed.all_reduce.__wrapped__ is collectives._watch.originals["all_reduce"]
    assert torch.distributed.broadcast_object_list is torch.distributed.distributed_c10d.broadcast_object_list


def recorded(run_dir) -> dict:
    path = RunDir(run_dir).rank_records(0)
    lines = [line for line in map(json.loads, path.read_text().splitlines()) if "time" in line]
    keys = {k for line in lines for k, value in line.items() if k.endswith("_seconds") and not isinstance(value, list)}
    return {key: sum(line.get(key) or 0 for line in lines) for key in keys}


def test_a_loops_collective_is_a_wait_at_the_collectives_not_data_wait_nor_forward(unwatched, tmp_path):
    model = torch.nn.Linear(4, 1)  # no DDP: the collectives alone make the rank's communication timed
    monitor = trainstack.monitor.start(model, run_dir=tmp_path, log_every=2)
    for _ in range(4):
        monitor.data_wait_started()
        timed_all_reduce(torch.ones(1))  # the Hugging Face Trainer's label-count gather while it fetches a batch
        monitor.data_ready()
        with monitor.forward():
            timed_all_reduce(torch.ones(1))  # a pre-hook's own reduction
            model(torch.ones(2, 4)).sum().backward()
        timed_all_reduce(torch.ones(1))  # the loop's metric
        monitor.step(2)
    monitor.close()
    figures = recorded(tmp_path)
    assert figures["comm_exposed_seconds"] >= 3 * 4 * WAIT
    assert figures["comm_seconds"] >= 3 * 4 * WAIT
    assert figures["data_wait_seconds"] < WAIT and figures["host_data_wait_seconds"] < WAIT
    assert figures["forward_seconds"] < WAIT


def test_inside_a_pause_a_collective_is_not_booked(unwatched, tmp_path):
    monitor = trainstack.monitor.start(torch.nn.Linear(4, 1), run_dir=tmp_path, log_every=1)
    monitor.step(1)
    with monitor.pause("evaluation"):
        timed_all_reduce(torch.ones(1))  # evaluation's reduction of its metric
    monitor.step(1)
    monitor.close()
    assert recorded(tmp_path).get("comm_exposed_seconds", 0.0) == 0.0


def test_the_reduction_of_an_intervals_totals_is_the_monitors_own(unwatched, tmp_path):
    """trainstack's Trainer reduces its loss across ranks in `interval_totals`: not the loop's collective."""

    def reduced(sums):
        timed_all_reduce(torch.ones(6))
        return sums.take()

    monitor = trainstack.monitor.start(torch.nn.Linear(4, 1), run_dir=tmp_path, log_every=1, interval_totals=reduced)
    for _ in range(3):
        monitor.step(1)
    monitor.close()
    assert recorded(tmp_path).get("comm_exposed_seconds", 0.0) == 0.0


def test_on_a_gpu_the_collectives_wait_is_the_streams_and_the_starvation_around_it_stays_data_wait(
    tmp_path, plain_env, monkeypatch
):
    """On a GPU rank NCCL's blocking call makes the current stream wait for the collective; the marks before and
    after it on that stream (CUDA events, a fake GPU here) span that wait. The data wait it interrupts is the GPU's
    starvation before it and after it: here the host's work after it is hidden behind the collective."""
    gpu = FakeGpu()
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: gpu.new_event())
    monkeypatch.setattr(GpuBusy, "open", classmethod(lambda cls, uuid: None))
    monkeypatch.setattr(GpuActivity, "open", classmethod(lambda cls, uuid: None))
    nccl_all_reduce = collectives._timed(lambda tensor, async_op=False: gpu.queue(0.02))
    monitor = Monitor(tmp_path, identity("GPU-0"), 1.0, None, torch.device("cuda"), log_every=1000)
    monitor.resumed_at(1)
    for _ in range(5):
        monitor.data_wait_started()
        gpu.host_works(0.003)  # the loader
        nccl_all_reduce(torch.ones(1))  # the label-count gather inside the fetch
        gpu.host_works(0.003)  # the copy to the device, while the stream still waits for the collective
        monitor.data_ready()
        gpu.queue(0.06)
        monitor.step(4)
    gpu.drain()
    monitor.flush()
    monitor.close()
    interval = read_json_lines(RunDir(tmp_path).rank_records(0))[1]
    # Only the first fetch starves the GPU, before its collective: later the host runs ahead of the stream
    assert interval["data_wait_seconds"] == pytest.approx(0.003)
    assert interval["comm_exposed_seconds"] == pytest.approx(5 * 0.02)
    assert interval["comm_seconds"] == pytest.approx(5 * 0.02)
