"""Gradient-communication times (trainstack/telemetry/comm_timer.py, with DDP's marks from
trainstack/telemetry/ddp_comm.py) from marks on a stand-in clock: the host's (a CPU rank) and the fake GPU of
tests/unit/trainstack/test_timeline.py (a GPU rank, where the host runs ahead of the marks). The figures follow from
the schedules by hand. DDP's marks come from a real reducer in this process, both ways they are taken: from DDP's
reducer timer (a CPU rank's) and from autograd's hooks (a GPU rank's, here on the CPU)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.fakes import FakeDdpModel, FakeGpu
from trainstack.monitor import Monitor
from trainstack.rundir import METRICS_DIR_ENV, RunDir
from trainstack.telemetry import ddp_comm
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
    assert model.hooks == [], "DDP's one communication hook is left to the user"
    # DDP's forward decides whether its backward synchronizes; the buffer broadcast ends at the start of the wrapped
    # module's forward
    assert len(model._forward_pre_hooks) == 1 and len(model.module._forward_pre_hooks) == 1


@pytest.fixture
def world_of_one():
    """A real gloo process group of one rank in this process (an in-memory store: no port, no other process), so
    that DDP's reducer and autograd run as in a rank."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(params=["reducer", "hooks"])
def ddp_timing(request, monkeypatch):
    """Each test of a DDP step's figures runs both ways the marks are taken: by DDP's reducer timer, as on a CPU rank,
    and by autograd's hooks, as on a GPU rank."""
    if request.param == "hooks":
        monkeypatch.setattr(ddp_comm, "_reducer_times", lambda model, timer, delayed: False)
    return request.param


@pytest.fixture
def hook_timing(monkeypatch):
    """The marks taken by autograd's hooks, as on a GPU rank: what a test of the hooks themselves needs."""
    monkeypatch.setattr(ddp_comm, "_reducer_times", lambda model, timer, delayed: False)


def ddp_model(width: int = 64, **options) -> DistributedDataParallel:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.Linear(width, width), torch.nn.Linear(width, 1)]
    return DistributedDataParallel(torch.nn.Sequential(*layers), **options)


def gradient_bytes(model: torch.nn.Module) -> int:
    return sum(parameter.numel() * 4 for parameter in model.parameters())


def slow_all_reduce(process_group, bucket):  # unannotated: DDP checks a hook's annotations, and these are strings
    """A hook of the user's whose all-reduce (of one rank: the bucket as it is) ends 50 ms after backward launched
    it, on another thread, as over a slow link."""
    reduced = torch.futures.Future()
    buffer = bucket.buffer()
    threading.Timer(SLOW, lambda: reduced.set_result(buffer)).start()
    return reduced


SLOW = 0.05
WAITED_AT_LEAST = 0.5 * SLOW
"""The wait for the slow all-reduce: its 50 ms less the backward compute left after DDP launched it (launched before
the last gradient of an unused head was marked ready, it has read 49.6 ms on a loaded machine; 39.9 ms once, the
test's process preempted for 11.6 ms between the launch and the end of backward, 3 pytest workers on 2 cores);
untimed, 0."""


def test_a_step_waits_from_the_end_of_backward_compute_to_the_end_of_ddps_wait(world_of_one, ddp_timing):
    """The wait is measured from the end of backward compute to the end of DDP's own wait for its all-reduces: a
    user's hook that ends 50 ms late is waited for, and the wait begins before it, not after."""
    timer, model = CommTimer(HostClock()), ddp_model()
    assert watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    model.register_comm_hook(None, slow_all_reduce)  # the timing leaves DDP's one hook free
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
        timer.step_done()
    steps = timer.read(timer.cut())
    assert len(steps) == 3
    for step in steps:
        assert WAITED_AT_LEAST <= step.exposed_seconds <= step.seconds and step.seconds >= SLOW
        assert (step.bytes, step.buckets) == (gradient_bytes(model), 1)


class TwoHeads(torch.nn.Module):
    """A trunk and two heads, one of them or both used a step: DDP's find_unused_parameters case."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, heads: str) -> torch.Tensor:
        h = self.trunk(x)
        return sum(getattr(self, head)(h) for head in heads.split("+"))


class Checkpointed(torch.nn.Module):
    """Its head checkpointed reentrantly: the head's gradients, the first backward computes, come in an inner
    backward with final callbacks of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.head = torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.head, self.trunk(x), use_reentrant=True)


@pytest.mark.parametrize(
    ("name", "model", "forwards"),
    [
        # the parameter whose gradient came first (the first step's head) gets none in the later steps
        (
            "an unused head",
            lambda: DistributedDataParallel(TwoHeads(), find_unused_parameters=True),
            [lambda m: m(torch.randn(4, 8), "first")] + [lambda m: m(torch.randn(4, 8), "second")] * 2,
        ),
        (
            "reentrant checkpointing",
            lambda: DistributedDataParallel(Checkpointed()),
            [lambda m: m(torch.randn(4, 8))] * 3,
        ),
        # DDP all-reduces static_graph's first step from a final callback of its own, queued from its output
        (
            "static_graph",
            lambda: DistributedDataParallel(torch.nn.Linear(8, 1), static_graph=True),
            [lambda m: m(torch.randn(4, 8))] * 3,
        ),
    ],
)
def test_every_synchronizing_step_waits_for_the_slow_all_reduce(world_of_one, ddp_timing, name, model, forwards):
    timer, ddp = CommTimer(HostClock()), model()
    watch_gradient_communication(ddp, timer, FutureCallbacks(), training=lambda: True)
    ddp.register_comm_hook(None, slow_all_reduce)
    for forward in forwards:
        forward(ddp).sum().backward()
        timer.step_done()
    steps = timer.read(timer.cut())
    assert len(steps) == len(forwards), name
    assert all(step.exposed_seconds >= WAITED_AT_LEAST for step in steps), (name, steps)


@pytest.mark.parametrize(
    ("name", "model", "hooks_after_the_first_step"),
    [
        ("a plain model", ddp_model, 0),
        # the first gradient comes in the checkpoint's inner backward: only the output's hook marks the outer one
        ("reentrant checkpointing", lambda: DistributedDataParallel(Checkpointed()), 2),
        # the first step's first gradient may get none later
        ("find_unused_parameters", lambda: ddp_model(width=8, find_unused_parameters=True), 2),
    ],
)
def test_the_first_gradient_marks_the_backward_once_it_is_known_to_be_the_outer_ones(
    world_of_one, hook_timing, monkeypatch, name, model, hooks_after_the_first_step
):
    """A hook on every forward's output is the dearest part of the timing: after the first synchronizing step the
    first gradient's hook marks the backward, where it comes in the outer backward and always comes. Every step is
    timed either way."""
    timer, ddp = CommTimer(HostClock()), model()
    watch_gradient_communication(ddp, timer, FutureCallbacks(), training=lambda: True)
    ddp.register_comm_hook(None, slow_all_reduce)
    width = next(ddp.parameters()).shape[1]
    ddp(torch.randn(4, width)).sum().backward()
    timer.step_done()
    hooked = []
    register_hook = torch.Tensor.register_hook
    monkeypatch.setattr(torch.Tensor, "register_hook", lambda t, hook: hooked.append(t) or register_hook(t, hook))
    for _ in range(2):
        ddp(torch.randn(4, width)).sum().backward()
        timer.step_done()
    assert len(hooked) == hooks_after_the_first_step, name
    steps = timer.read(timer.cut())
    assert len(steps) == 3 and all(step.exposed_seconds >= WAITED_AT_LEAST for step in steps), (name, steps)


def test_a_model_watched_twice_is_timed_once(world_of_one, ddp_timing):
    timer, model = CommTimer(HostClock()), ddp_model()
    for _ in range(2):
        assert watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    model(torch.randn(8, 64)).sum().backward()
    timer.step_done()
    assert [(step.bytes, step.buckets) for step in timer.read(timer.cut())] == [(gradient_bytes(model), 1)]


def test_micro_batches_under_no_sync_join_the_step_that_synchronizes(world_of_one, ddp_timing):
    timer, model = CommTimer(HostClock()), ddp_model()
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    with model.no_sync():
        model(torch.randn(8, 64)).sum().backward()
    timer.step_done()
    assert timer.cut() == [], "a micro-batch under no_sync communicates nothing"
    model(torch.randn(8, 64)).sum().backward()
    timer.step_done()
    assert [step.buckets for step in timer.read(timer.cut())] == [1]


def test_a_forward_without_grad_before_the_backward_leaves_the_step_timed(world_of_one, ddp_timing):
    """On the first step, whose output's hook marks the backward, and on a later one, whose first gradient does."""
    timer, model = CommTimer(HostClock()), ddp_model()
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    for _ in range(2):
        loss = model(torch.randn(8, 64)).sum()
        with torch.no_grad():
            model(torch.randn(8, 64))  # a look at the outputs, between the training forward and its backward
        loss.backward()
        timer.step_done()
    assert len(timer.read(timer.cut())) == 2


@pytest.mark.parametrize("steps_before", [0, 2], ids=["from the start", "after the first gradient marks backward"])
def test_no_step_is_timed_while_the_loop_is_not_training(world_of_one, ddp_timing, steps_before):
    timer, model, training = CommTimer(HostClock()), ddp_model(), [True]
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: training[0])
    for _ in range(steps_before):
        model(torch.randn(8, 64)).sum().backward()
        timer.step_done()
    timer.cut()
    training[0] = False  # a pause: its forward and backward (with grad) are no step's
    model(torch.randn(8, 64)).sum().backward()
    timer.step_done()
    assert timer.cut() == []


def test_ddps_compression_hook_is_kept_and_sends_half_the_bytes(world_of_one, ddp_timing):
    timer, model = CommTimer(HostClock()), ddp_model(512, bucket_cap_mb=0.25)  # a bucket a weight
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    inputs = torch.randn(8, 512)
    for _ in range(5):
        model.zero_grad()
        model(inputs).sum().backward()
        timer.step_done()
    local = ddp_model(512).module
    local(inputs).sum().backward()
    assert all(
        torch.equal(ours.grad, theirs.grad.half().float())
        for ours, theirs in zip(model.parameters(), local.parameters(), strict=True)
    ), "the gradients went through the user's hook"
    steps = timer.read(timer.cut())
    assert steps[-1].bytes == gradient_bytes(model) // 2
    assert steps[0].buckets == 1 and steps[-1].buckets == 2, "DDP's bucket count, once it has sized them"


class WithBatchNorm(torch.nn.Module):
    """A model with buffers, which DDP broadcasts from rank 0 at each training forward, and a forward pre-hook of the
    user's that works for 30 ms before the forward: the rank's own work, not the broadcast's."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        self.register_forward_pre_hook(lambda module, args: time.sleep(0.03))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_the_buffer_broadcast_is_timed_apart_from_the_users_forward_pre_hook(world_of_one, ddp_timing):
    timer, model = CommTimer(HostClock()), DistributedDataParallel(WithBatchNorm())
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        timer.step_done()
    buffer_bytes = sum(buffer.numel() * buffer.element_size() for buffer in model.module.buffers())
    for step in timer.read(timer.cut()):
        assert (step.bytes, step.buckets) == (gradient_bytes(model) + buffer_bytes, 2), "the broadcast and a bucket"
        assert step.exposed_seconds < 0.03, "the user's pre-hook is no part of the broadcast's wait"


def test_a_cpu_rank_is_timed_by_ddps_reducer_with_no_python_in_backward(world_of_one):
    """DDP's reducer marks the step in C++ on the system's clock; the step's marks are read as it closes and put on
    perf_counter's, between the forward's start and the step's end."""
    timer, model = CommTimer(HostClock()), ddp_model()
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    model.register_comm_hook(None, slow_all_reduce)
    assert not model._forward_pre_hooks and not model._forward_hooks, "no buffers: no hook on the wrapper"
    assert all(not parameter._post_accumulate_grad_hooks for parameter in model.parameters())
    windows = []
    for _ in range(3):
        started = time.perf_counter()
        model(torch.randn(8, 64)).sum().backward()
        timer.step_done()
        windows.append((started, time.perf_counter()))
    steps = timer.cut()
    assert len(steps) == 3
    for step, (started, ended) in zip(steps, windows, strict=True):
        [collective], [wait] = step.collectives, step.waits
        assert started < collective.launched <= wait.ready < collective.done < ended
        assert collective.done - wait.ready >= WAITED_AT_LEAST
    assert all(comm.exposed_seconds >= WAITED_AT_LEAST for comm in timer.read(steps))


def test_the_reducers_statistics_are_computed_once_a_step_as_it_closes_not_again_by_ddps_forward(
    world_of_one, monkeypatch
):
    """Sampling every step, DDP's forward would compute the step before's statistics, which its close computed."""
    computed = []
    compute = dist.Logger.set_runtime_stats_and_log
    monkeypatch.setattr(dist.Logger, "set_runtime_stats_and_log", lambda logger: computed.append(compute(logger)))
    timer, model = CommTimer(HostClock()), ddp_model()
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)
    watch_gradient_communication(model, timer, FutureCallbacks(), training=lambda: True)  # a second watch: no-op
    computed.clear()
    for step in range(1, 4):
        model(torch.randn(8, 64)).sum().backward()
        timer.step_done()
        assert len(computed) == step
    assert len(timer.cut()) == 3, "each step timed from the statistics its close computed"


def test_the_reducer_times_a_cpu_model_unless_the_test_delay_or_a_gpu_needs_the_hooks(world_of_one):
    model, on_host = ddp_model(), CommTimer(HostClock())
    assert ddp_comm._reducer_times(model, on_host, delayed=False)
    assert not ddp_comm._reducer_times(model, on_host, delayed=True), "the delay is held inside DDP's wait"
    on_gpu = CommTimer(DeviceClock(FakeGpu().new_event))
    assert not ddp_comm._reducer_times(model, on_gpu, delayed=False), "a GPU rank's marks are CUDA events"
    model.device_type = "cuda"
    assert not ddp_comm._reducer_times(model, on_host, delayed=False), "a GPU reducer's timer syncs the host"


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
