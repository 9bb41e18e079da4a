"""DDP's communication, timed (trainstack/telemetry/comm_timer.py defines the figures; comm.py says which
collectives): its gradient all-reduce and its buffer broadcast. No collective and no communication hook is added.

The gradient all-reduce is timed one of two ways, chosen when the model is first watched (`time_ddp`):
- **On a CPU rank, by DDP's own reducer timer** (`DdpReducerTiming`): the reducer marks, in C++, the launch of its
  first bucket, the end of backward compute and the end of its wait, for its logger. trainstack asks it to mark
  every step and reads the three marks once a step, as the step closes: no Python runs inside backward, where on
  a CPU rank each call from autograd's engine costs a few hundredths of a millisecond between large kernels
  (docs/benchmarks.md, "Where the cost is").
- **On a GPU rank, by autograd's hooks** (`DdpHookTiming`): the same marks as CUDA events on the current stream.
  DDP's reducer times a GPU rank with CUDA events too, but waits for the last step's at each forward, a host sync
  the training loop does not have. Also where a CPU model's reducer cannot time the step as the rank does: the
  rank's clock is the GPU's; the test-only delay is set (comm.py: it is held after DDP's wait, which only the hooks'
  marks bracket from outside); or `TORCH_DISTRIBUTED_DEBUG=DETAIL`, under which DDP logs its statistics at each step
  it times.

The buffer broadcast (`DdpBufferBroadcast`) is timed from forward pre-hooks either way: it blocks the forward, which
the reducer does not time apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainstack.telemetry.comm_timer import Collective, CommTimer

DDP_GRADIENTS = "ddp-gradients"
"""The CommTimer group of a DDP step's gradient all-reduce."""
BUCKETS_SETTLED_BY = 5
"""DDP sizes its buckets when it wraps the model, then anew in the order the first step's gradients came (its
logging data says so two or three steps in): the bucket count is read at the wrap, then after each of the first
synchronizing steps until the new sizes show."""


def time_ddp(
    model: DistributedDataParallel,
    timer: CommTimer,
    training: Callable[[], bool],
    delay: Callable[[], None] | None = None,
) -> None:
    """Times `model`'s gradient all-reduce and buffer broadcast from now on; `training()`: whether the loop trains
    now (no pause is open); `delay`: the test-only delay (comm.py), called once a bucket after its all-reduce."""
    buckets = DdpBuckets(model)
    broadcast = DdpBufferBroadcast(model, timer) if DdpBufferBroadcast.needed(model) else None
    if _reducer_times(model, timer, delayed=delay is not None):
        DdpReducerTiming(model, timer, buckets, training)
        if broadcast is not None:
            model.register_forward_pre_hook(
                lambda wrapper, args: broadcast.forward_starts() if torch.is_grad_enabled() and training() else None
            )
    else:
        DdpHookTiming(model, timer, buckets, broadcast, training, delay)


def _reducer_times(model: DistributedDataParallel, timer: CommTimer, delayed: bool) -> bool:
    """Whether DDP's reducer times `model`'s steps as `DdpReducerTiming` reads them: a CPU model with torch's C++
    reducer (not the Python one of compiled autograd), on a timer of the host's clock."""
    return (
        getattr(model, "device_type", None) == "cpu"
        and timer.on_host
        and not delayed
        and not getattr(model, "_use_python_reducer", False)
        and hasattr(getattr(model, "logger", None), "set_runtime_stats_and_log")
        and dist.get_debug_level() != dist.DebugLevel.DETAIL
    )


class DdpBuckets:
    """How many buckets DDP all-reduces a model's gradients in, and the bytes it sends (half the gradients' under
    its fp16 and bf16 compression hooks), from DDP's logging data and hook list: private, so read defensively (a
    torch without them leaves one bucket of the gradients' bytes)."""

    def __init__(self, model: DistributedDataParallel):
        self._model = model
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self._elements = sum(parameter.numel() for parameter in parameters)
        self.bytes = sum(parameter.numel() * parameter.element_size() for parameter in parameters)
        self.count = 1
        self._final = False
        self._synced_steps = 0
        self._read()

    def synced(self) -> None:
        """A step all-reduced the gradients."""
        self._synced_steps += 1
        if not self._final and self._synced_steps <= BUCKETS_SETTLED_BY:
            self._read()

    def _read(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        try:
            logged = self._model._get_ddp_logging_data()
            rebuilt = logged.get("rebuilt_bucket_sizes")
            sizes = str(rebuilt or logged.get("bucket_sizes", ""))
            hooks = [hook for hook, _ in getattr(self._model, "_comm_hooks", ())]
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return
        self._final = bool(rebuilt)
        self.count = max(1, len([size for size in sizes.split(",") if size.strip()]))
        if any(hook in (default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook) for hook in hooks):
            self.bytes = 2 * self._elements


class DdpBufferBroadcast:
    """DDP's buffer broadcast: with `broadcast_buffers=True` (the default) a model with buffers (BatchNorm's running
    statistics, a causal mask) has rank 0's buffers broadcast at the start of every forward pass
    (`DistributedDataParallel._pre_forward`), so a rank waits there for a slower peer. It blocks compute: its launch
    is marked by the wrapper's forward pre-hook (`forward_starts`, before `_pre_forward`), its end by the first
    pre-hook of the wrapped module (after it, before any pre-hook of the user's there), both on the current stream,
    which on a GPU waits for the broadcast."""

    def __init__(self, model: DistributedDataParallel, timer: CommTimer):
        self._model, self._timer = model, timer
        self._bytes = sum(buffer.numel() * buffer.element_size() for buffer in model.modules_buffers)
        self._broadcasts: list[Collective] = []
        # First of the wrapped module's pre-hooks: one the user or a library (PEFT, Accelerate) registered there is
        # the rank's own forward work, after the broadcast, not part of it.
        model.module.register_forward_pre_hook(self._done, prepend=True)

    @staticmethod
    def needed(model: DistributedDataParallel) -> bool:
        """Whether DDP broadcasts `model`'s buffers: a hook costs a module every call, so only where it does."""
        return bool(model.broadcast_buffers and model.modules_buffers)

    def forward_starts(self) -> None:
        """A training forward starts (the wrapper's pre-hook, with grad enabled and no pause open)."""
        # The check DDP's _pre_forward makes next; it reads what the previous forward pass left.
        if self._model._check_sync_bufs_pre_fwd():
            self._broadcasts.append(self._timer.launched(self._bytes, blocking=True))

    def _done(self, module, args) -> None:
        if self._broadcasts:
            self._timer.done(self._broadcasts.pop())


class DdpReducerTiming:
    """A CPU model's gradient all-reduce, from the marks DDP's reducer takes for its logger (torch's
    reducer_timer.hpp): the launch of its first bucket, the end of backward compute (where DDP's final callback
    begins to wait) and the end of that wait, in the system clock's nanoseconds. The reducer takes them at the
    steps it samples (every hundredth by default), here every step. Its logger would compute a step's marks as the
    next forward starts; here `set_runtime_stats_and_log` computes them once, as the step closes (the wrapper's
    forward calls a stand-in), and they are read there. That costs about 100 us of C++ a step in a CPU rank
    (docs/benchmarks.md), against the hooks' calls from autograd's engine inside backward.

    A step with no new end mark synchronized nothing (a micro-batch under `no_sync`, or no backward). A backward
    through the model inside a pause, followed only by micro-batches under `no_sync` before the next step closes,
    would be booked to that step: a loop that computes gradients through its DDP model while it evaluates or
    saves, then accumulates, is the one that would see it."""

    def __init__(
        self,
        model: DistributedDataParallel,
        timer: CommTimer,
        buckets: DdpBuckets,
        training: Callable[[], bool],
    ):
        self._timer, self._buckets, self._training = timer, buckets, training
        model._set_ddp_runtime_logging_sample_rate(1)
        self._logger = _LoggerComputedAtClose.put_in(model)
        self._logger.set_runtime_stats_and_log()  # the steps before the watch are no step of its
        self._last_end = self._marks().get("backward_comm_time_end")
        timer.closing_step(self._step_closes)

    def _marks(self) -> Mapping[str, int]:
        return self._logger._get_ddp_logging_data().ints_map

    def _step_closes(self) -> None:
        self._logger.set_runtime_stats_and_log()
        marks = self._marks()
        end = marks.get("backward_comm_time_end")
        if not end or end == self._last_end:
            return
        self._last_end = end
        if not self._training():
            return
        # The reducer's clock is the system's (c10::getTime); the timer's is perf_counter's
        offset = time.perf_counter_ns() - time.time_ns()
        launched, ready = marks["backward_comm_time_start"], marks["backward_compute_time_end"]
        self._timer.timed(
            (launched + offset) * 1e-9,
            (ready + offset) * 1e-9,
            (end + offset) * 1e-9,
            self._buckets.bytes,
            pieces=self._buckets.count,
        )
        self._buckets.synced()


class _LoggerComputedAtClose:
    """DDP's logger as its wrapper sees it once `DdpReducerTiming` reads it: DDP's forward computes the previous
    step's statistics (`set_runtime_stats_and_log`) at each step it samples, now every step, which the step's close
    has computed already; here that call does nothing (37-45 us of C++ a step saved in a world of one:
    docs/benchmarks.md). Everything else is the logger's own. The reducer holds the logger itself, not this."""

    def __init__(self, logger: dist.Logger):
        self._logger = logger

    @classmethod
    def put_in(cls, model: DistributedDataParallel) -> dist.Logger:
        """Puts the stand-in in `model`'s place of its logger, once; returns the logger itself."""
        if not isinstance(model.logger, cls):
            model.logger = cls(model.logger)
        return model.logger._logger

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._logger, name)


class DdpHookTiming:
    """A model's gradient all-reduce, timed from torch's autograd and module hooks, with no communication hook: DDP
    takes one per model (the user's stays free), and with one registered the reducer no longer scales the gradients
    to their mean as it copies them into a bucket, so a hook pays a pass of its own over every bucket (on a CPU rank
    as long as the all-reduce call itself).

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
        model: DistributedDataParallel,
        timer: CommTimer,
        buckets: DdpBuckets,
        broadcast: DdpBufferBroadcast | None,
        training: Callable[[], bool],
        delay: Callable[[], None] | None,
    ):
        self._model, self._timer, self._buckets, self._broadcast = model, timer, buckets, broadcast
        self._delay, self._training = delay, training
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
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
        model.register_forward_pre_hook(self._forward_starts)
        # Removed once the first gradient queues the marks (_decide_where_to_queue): a hook costs every forward
        self._hooking_outputs = model.register_forward_hook(self._forward_done)

    def _forward_starts(self, wrapper, args) -> None:
        grad = torch.is_grad_enabled()
        self._trains = grad and self._training()
        if not self._trains:
            if grad:
                self._syncs = False  # a forward in a pause: its backward is no step's
            return  # one without grad (a look at the outputs) leaves the training forward's backward as it was
        self._syncs = self._model.require_backward_grad_sync
        if self._broadcast is not None:
            self._broadcast.forward_starts()

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
        self._collective = self._launched()

    def _launched(self) -> Collective:
        return self._timer.launched(self._buckets.bytes, group=DDP_GRADIENTS, pieces=self._buckets.count)

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
            self._collective = self._launched()
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
        if self._delay is not None:
            for _ in range(self._collective.pieces):  # each bucket's all-reduce held back, one after another
                self._delay()
        self._timer.done(self._collective)
        self._timer.waited(self._ready, DDP_GRADIENTS)
        self._collective = None
        self._queued = False
        self._buckets.synced()


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
