"""Times the communication of a training step (trainstack/telemetry/comm_timer.py defines the figures): DDP's gradient
all-reduce here, FSDP2's all-gathers and reduce-scatters in trainstack/telemetry/fsdp_comm.py. No collective is added.

- **DDP** all-reduces the gradients in buckets while backward still computes the earlier layers' gradients: the
  reducer launches a bucket once all its gradients are ready, and `loss.backward()` returns once every bucket's
  all-reduce is done. Its one wait is at the end of backward, from the end of backward compute (the last bucket's
  launch) to the end of the last all-reduce. The marks come from autograd's hooks, not from a DDP communication hook
  (`DdpTiming` says how and why): the step's communication is timed as one collective, in flight from the first
  gradient ready to the end of the last all-reduce. torch's reducer keeps the same two figures for its own logger
  (reducer_timer.hpp: backward_comm_time, backward_compute_comm_overlap_time), every hundredth step.
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
import weakref
from collections.abc import Callable, Mapping

import torch

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


DDP_GRADIENTS = "ddp-gradients"
"""The CommTimer group of a DDP step's gradient all-reduce."""
BUCKETS_SETTLED_BY = 5
"""DDP sizes its buckets when it wraps the model, then anew in the order the first step's gradients came (its
logging data says so two or three steps in): the bucket count is read at the wrap, then after each of the first
synchronizing steps until the new sizes show."""


class DdpTiming:
    """Times a DDP model's gradient all-reduce and buffer broadcast from torch's autograd and module hooks, with no
    communication hook: DDP takes one per model (the user's stays free), and with one registered the reducer no
    longer scales the gradients to their mean as it copies them into a bucket, so a hook pays a pass of its own
    over every bucket (on a CPU rank as long as the all-reduce call itself).

    A synchronizing step (DDP's forward decides, as its reducer does: grad enabled, outside `no_sync`) is timed by
    a few Python calls, whatever the bucket count:
    - the start of backward: a hook on the forward's output (the first tensor of it that needs a gradient) queues
      an autograd final callback. The engine runs its final callbacks in order once every gradient is computed, and
      DDP queues its own, which waits for the all-reduces and copies their results into the gradients, only when
      its last bucket is ready (or, on static_graph's first step, from its output's backward): after this one. The
      output's hook runs in the outer backward, even where the model checkpoints its layers reentrantly (their
      inner backward passes run their own final callbacks). Not where it checkpoints all of itself so: DDP's last
      bucket is then ready inside the checkpoint's backward, whose end DDP waits at, and the wait reads as compute.
      A hook on every forward's output costs more than the rest of the timing (a tensor hook runs Python in the
      engine's graph task), so once the first synchronizing step has shown that the first gradient comes in the
      outer backward (`_decide_where_to_queue`), that gradient's hook queues the callback instead: it comes before
      DDP's last bucket, so still before DDP's callback. Not under find_unused_parameters, where it may get none.
    - the launch: the gradient backward computes first is ready (its parameter's post-accumulate-grad hook; which
      parameter that is, the first synchronizing backward tells, with a hook on each for that once). DDP's first
      bucket goes out once the rest of it is ready. A step where that parameter gets no gradient (an unused head
      under find_unused_parameters) is in flight from the end of backward compute only.
    - the end of backward compute: that first final callback.
    - the end of the all-reduce: a final callback the first queues, so it runs after DDP's. On a GPU rank the marks
      are events on the current stream, which DDP's wait makes wait for the all-reduce.
    """

    def __init__(
        self,
        model: torch.nn.parallel.DistributedDataParallel,
        timer: CommTimer,
        delay: InjectedDelay,
        training: Callable[[], bool],
    ):
        self._model, self._timer, self._delay, self._training = model, timer, delay, training
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self._elements = sum(parameter.numel() for parameter in parameters)
        self._bytes = sum(parameter.numel() * parameter.element_size() for parameter in parameters)
        self._buckets = 1
        self._buckets_final = False
        self._synced_steps = 0
        self._trains = False  # the last forward's: a training one (grad enabled, no pause)
        self._syncs = False  # the last training forward's: whether its backward all-reduces
        self._from_first_gradient = False  # its output had no tensor to hook: the first gradient queues the marks
        self._at_first_gradient = False  # every synchronizing backward's first gradient queues them
        self._backwards_computed = 0
        self._queued = False  # this backward's final callbacks are queued
        self._first: torch.Tensor | None = None
        self._finding_the_first = [
            parameter.register_post_accumulate_grad_hook(self._gradient_ready) for parameter in parameters
        ]
        self._collective: Collective | None = None
        self._ready = None  # the end of backward compute: the mark the all-reduce's wait starts from
        self._engine = torch.autograd.Variable._execution_engine
        self._broadcasts: list[Collective] = []
        self._read_buckets()
        model.register_forward_pre_hook(self._forward_starts)
        # Removed once the first gradient queues the marks (_decide_where_to_queue): a hook costs every forward
        self._hooking_outputs = model.register_forward_hook(self._forward_done)
        self._broadcasts_buffers = bool(model.broadcast_buffers and model.modules_buffers)
        self._buffer_bytes = sum(buffer.numel() * buffer.element_size() for buffer in model.modules_buffers)
        if self._broadcasts_buffers:  # a hook costs a module every call: only where needed
            # First of the wrapped module's pre-hooks: one the user or a library (PEFT, Accelerate) registered there
            # is the rank's own forward work, after the broadcast, not part of it.
            model.module.register_forward_pre_hook(self._broadcast_done, prepend=True)

    def _forward_starts(self, wrapper, args) -> None:
        model = self._model
        grad = torch.is_grad_enabled()
        self._trains = grad and self._training()
        if not self._trains:
            if grad:
                self._syncs = False  # a forward in a pause: its backward is no step's
            return  # one without grad (a look at the outputs) leaves the training forward's backward as it was
        self._syncs = model.require_backward_grad_sync
        # The check DDP's _pre_forward makes next; it reads what the previous forward pass left.
        if self._broadcasts_buffers and model._check_sync_bufs_pre_fwd():
            self._broadcasts.append(self._timer.launched(self._buffer_bytes, blocking=True))

    def _broadcast_done(self, module, args) -> None:
        if self._broadcasts:
            self._timer.done(self._broadcasts.pop())

    def _forward_done(self, wrapper, args, output) -> None:
        if not (self._trains and self._syncs) or self._at_first_gradient:
            return
        tensor = _needing_grad(output)
        self._from_first_gradient = tensor is None
        if tensor is not None:
            tensor.register_hook(self._backward_starts)

    def _backward_starts(self, grad: torch.Tensor) -> None:
        self._queue()

    def _queue(self) -> None:
        if not self._queued:
            self._queued = True
            self._engine.queue_callback(self._backward_computed)

    def _gradient_ready(self, parameter: torch.Tensor) -> None:
        if self._collective is not None or (self._first is not None and parameter is not self._first):
            return
        if not self._queued:
            if not ((self._from_first_gradient or self._at_first_gradient) and self._syncs):
                return  # a backward that does not all-reduce (no_sync), or none of this model's forward
            self._queue()
        elif self._finding_the_first and not self._model.find_unused_parameters:
            computed = self._backwards_computed
            self._engine.queue_callback(lambda: self._decide_where_to_queue(computed))
        self._first = parameter
        self._collective = self._timer.launched(self._bytes, group=DDP_GRADIENTS, pieces=self._buckets)

    def _decide_where_to_queue(self, computed_before: int) -> None:
        """Queued by the first synchronizing step's first gradient, after the output's hook queued
        `_backward_computed`: in the same backward it runs after it, and the first gradient can queue the marks from
        now on. Before it, the gradient came in an inner backward (a reentrant checkpoint's), whose final callbacks
        run at that backward's end: the output's hook stays."""
        self._at_first_gradient = self._backwards_computed > computed_before
        if self._at_first_gradient:
            self._hooking_outputs.remove()

    def _backward_computed(self) -> None:
        self._backwards_computed += 1
        if self._collective is None:  # the first gradient's parameter got none this step
            self._collective = self._timer.launched(self._bytes, group=DDP_GRADIENTS, pieces=self._buckets)
        ready = self._timer.mark()
        if self._finding_the_first and self._first is not None:  # found: one hook a step from now on
            for handle in self._finding_the_first:
                handle.remove()
            self._finding_the_first = []
            self._first.register_post_accumulate_grad_hook(self._gradient_ready)
        self._ready = ready
        self._engine.queue_callback(self._all_reduced)

    def _all_reduced(self) -> None:
        assert self._collective is not None
        if self._delay.seconds:
            for _ in range(self._collective.pieces):  # each bucket's all-reduce held back, one after another
                self._delay()
        self._timer.done(self._collective)
        self._timer.waited(self._ready, DDP_GRADIENTS)
        self._collective = None
        self._queued = False
        self._synced_steps += 1
        if not self._buckets_final and self._synced_steps <= BUCKETS_SETTLED_BY:
            self._read_buckets()

    def _read_buckets(self) -> None:
        """How many buckets DDP all-reduces the gradients in, and the bytes it sends (half the gradients' under its
        fp16 and bf16 compression hooks), from DDP's logging data and hook list: private, so read defensively (a
        torch without them leaves one bucket of the gradients' bytes)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        try:
            logged = self._model._get_ddp_logging_data()
            rebuilt = logged.get("rebuilt_bucket_sizes")
            sizes = str(rebuilt or logged.get("bucket_sizes", ""))
            hooks = [hook for hook, _ in getattr(self._model, "_comm_hooks", ())]
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return
        self._buckets_final = bool(rebuilt)
        self._buckets = max(1, len([size for size in sizes.split(",") if size.strip()]))
        if any(hook in (default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook) for hook in hooks):
            self._bytes = 2 * self._elements


def _needing_grad(output: object) -> torch.Tensor | None:
    """The first tensor of a forward's output that backward will reach: the output itself, or inside the tuples,
    lists and mappings (a transformers ModelOutput, Lightning's step output) it is made of."""
    pending = [output]
    while pending:
        value = pending.pop(0)
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                return value
        elif isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, list | tuple):
            pending.extend(value)
    return None


_TIMED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""DDP models timed already in this process: a second `watch` of one adds no second set of marks."""


def watch_gradient_communication(
    model: torch.nn.Module,
    timer: CommTimer,
    callbacks: FutureCallbacks,
    training: Callable[[], bool],
) -> bool:
    """Times a DDP model's gradient all-reduce and buffer broadcast, or an FSDP2 model's all-gathers and
    reduce-scatters; False (nothing registered) for anything else, and for FSDP on one rank, which communicates
    nothing. `training()`: whether the loop trains now (no pause is open). `callbacks` registers the marks that end
    an FSDP collective."""
    delay = InjectedDelay.from_environment()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        if model not in _TIMED:
            _TIMED.add(model)
            DdpTiming(model, timer, delay, training)
        return True
    # Only a model wrapped by torch.distributed.fsdp can be an FSDP module, and importing that package costs each
    # rank about a second of CPU (torch.distributed.tensor): a DDP or plain model never loads it.
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from trainstack.telemetry.fsdp_comm import watch_fsdp_communication

    return watch_fsdp_communication(model, timer, delay, callbacks)
