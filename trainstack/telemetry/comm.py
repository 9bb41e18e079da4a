"""Times the communication of a training step (trainstack/telemetry/comm_timer.py defines the figures): DDP's gradient
all-reduce here, FSDP2's all-gathers and reduce-scatters in trainstack/telemetry/fsdp_comm.py. No collective is added.

- **DDP** all-reduces the gradients in buckets while backward still computes the earlier layers' gradients: the
  reducer launches a bucket once all its gradients are ready, and `loss.backward()` returns once every bucket's
  all-reduce is done. Its one wait is at the end of backward, from the last bucket's launch (when backward compute
  ended) to the end of the last all-reduce. The marks come from a DDP communication hook (`register_comm_hook`, the
  public route) around DDP's own all-reduce (the bucket's mean, as DDP without a hook computes it) or the hook the
  user gave: the launch when the reducer calls it, on the stream backward computes on (when the bucket's gradients
  are computed), the end in the all-reduce future's `then` callback (on a GPU, CUDA futures run their callbacks
  with current streams that wait for the all-reduce; on a CPU rank it runs when gloo has finished). torch's reducer
  keeps the same two figures for its own logger (reducer_timer.hpp: backward_comm_time,
  backward_compute_comm_overlap_time).
- **DDP's buffer broadcast**: with `broadcast_buffers=True` (the default) a model with buffers (BatchNorm's running
  statistics, a causal mask) has rank 0's buffers broadcast at the start of every forward pass
  (`DistributedDataParallel._pre_forward`), so a rank waits there for a slower peer. It blocks compute: its launch
  is marked by a forward pre-hook on the DDP wrapper (before `_pre_forward`), its end by the first pre-hook of the
  wrapped module (after it, before any pre-hook of the user's there), both on the current stream, which on a GPU
  waits for the broadcast.
- Every other collective the rank calls (a framework's, the loop's own): trainstack/telemetry/collectives.py.
- **FSDP2** (train/rank/sharding.py) all-gathers each unit's parameters before its forward and again before its
  backward, and reduce-scatters its gradients after; compute waits for each all-gather where the unit needs its
  parameters, and for each reduce-scatter before the next unit's (trainstack/telemetry/fsdp_comm.py has the marks and
  which waits are where).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from trainstack.telemetry.comm_timer import Collective, CommTimer
from trainstack.telemetry.future_callbacks import FutureCallbacks

# Test-only: seconds each collective (DDP's gradient all-reduce, FSDP's all-gather and reduce-scatter) is held back
# after it finishes, as a slow link would. The tests that make a run communication-bound set it
# (tests/timing/test_diagnose.py); nothing else reads it.
TEST_ALLREDUCE_DELAY_ENV = "TRAINSTACK_TEST_ALLREDUCE_DELAY"


class InjectedDelay:
    """Test-only (TEST_ALLREDUCE_DELAY_ENV): holds each collective back after it finishes, one after another as
    collectives on one link are."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> InjectedDelay:
        return cls(float(os.environ.get(TEST_ALLREDUCE_DELAY_ENV, "0")))

    def __call__(self) -> None:
        if self.seconds:
            with self._lock:
                time.sleep(self.seconds)


def timed_allreduce_hook(
    timer: CommTimer, delay: InjectedDelay, callbacks: FutureCallbacks, inner: Callable | None = None
):
    """DDP's own all-reduce, or `inner` (a hook of DDP's kind, such as its fp16 and bf16 compression), with the
    timer's marks around it. The bytes are those sent: half the bucket's under DDP's compression hooks, the
    bucket's under any other (a hook of the user's own may send fewer)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    compressed = inner in (default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook)

    def finished(collective: Collective, future: torch.futures.Future):
        delay()
        timer.done(collective)
        return future.value()

    # Unannotated: DDP checks a hook's annotations against its types, and this module's are strings.
    def hook(process_group, bucket):
        buffer = bucket.buffer()
        collective = timer.launched(buffer.numel() * (2 if compressed else buffer.element_size()))
        if inner is not None:
            return callbacks.then(
                inner(process_group, bucket), lambda future: finished(collective, future), first=False
            )
        # The bucket's mean, as DDP without a hook computes it: a product by the reciprocal (DDP's reducer folds it
        # into its copy into the bucket, which a hook's bucket has had already), not torch's allreduce_hook's
        # division, which costs a CPU rank twice the time over the bucket. Straight to the process group: the
        # checks of `dist.all_reduce` are for a caller's arguments, and DDP's are known good. No `then` but ours,
        # which gloo's thread would drop after this one's (trainstack/telemetry/future_callbacks.py).
        group = process_group if process_group is not None else dist.group.WORLD
        buffer.mul_(1.0 / group.size())
        work = group.allreduce([buffer]).get_future()
        return callbacks.then(work, lambda future: finished(collective, future)[0])

    return hook


def time_buffer_broadcast(
    model: torch.nn.parallel.DistributedDataParallel, timer: CommTimer, training: Callable[[], bool]
) -> None:
    """Times the buffer broadcast of each training forward pass: `training()` is False during an evaluation pause,
    and a forward pass under no_grad is no training step either."""
    broadcasts: list[Collective] = []

    def launching(wrapper, args) -> None:
        # The check _pre_forward makes next; it reads what the previous forward pass left.
        if model._check_sync_bufs_pre_fwd() and torch.is_grad_enabled() and training():
            nbytes = sum(buffer.numel() * buffer.element_size() for buffer in model.modules_buffers)
            broadcasts.append(timer.launched(nbytes, blocking=True))

    def broadcast_done(module, args) -> None:
        if broadcasts:
            timer.done(broadcasts.pop())

    model.register_forward_pre_hook(launching)
    # First of the wrapped module's pre-hooks: one the user or a library (PEFT, Accelerate) registered there is the
    # rank's own forward work, after the broadcast, not part of it.
    model.module.register_forward_pre_hook(broadcast_done, prepend=True)


def watch_gradient_communication(
    model: torch.nn.Module,
    timer: CommTimer,
    callbacks: FutureCallbacks,
    training: Callable[[], bool],
    comm_hook: Callable | None = None,
) -> bool:
    """Times a DDP model's gradient all-reduce (through `comm_hook` where given: DDP takes one hook per model, so
    the timing wraps it) and buffer broadcast, or an FSDP2 model's all-gathers and reduce-scatters; False (nothing
    registered) for anything else, and for FSDP on one rank, which communicates nothing. `training()`: whether the
    loop trains now (no pause is open). `callbacks` registers the marks that end a collective."""
    delay = InjectedDelay.from_environment()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(None, timed_allreduce_hook(timer, delay, callbacks, comm_hook))
        time_buffer_broadcast(model, timer, training)
        return True
    # Only a model wrapped by torch.distributed.fsdp can be an FSDP module, and importing that package costs each
    # rank about a second of CPU (torch.distributed.tensor): a DDP or plain model never loads it.
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from trainstack.telemetry.fsdp_comm import watch_fsdp_communication

    return watch_fsdp_communication(model, timer, delay, callbacks)
