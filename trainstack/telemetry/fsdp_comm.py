"""FSDP2's communication, timed (trainstack/telemetry/comm_timer.py defines the figures): each unit's parameter
all-gathers and gradient reduce-scatters, and the places compute waits for them.

Public routes only. `FSDPModule.set_custom_all_gather` and `set_custom_reduce_scatter` run each unit's collectives
through timed copies of FSDP's own (`dist.all_gather_single`, `dist.reduce_scatter_single` into `torch.empty`
buffers, what DefaultAllGather and DefaultReduceScatter do), which mark a collective's launch and end on the stream
FSDP runs it on. Module and gradient hooks registered around FSDP's own mark the compute stream where FSDP is about
to make it wait (torch/distributed/fsdp/_fully_shard, torch 2.13):

- before a unit's forward, FSDP's pre-hook (prepended when the unit was sharded) waits for the unit's all-gather;
  a pre-hook prepended later marks the compute stream before it, one appended says that the unit's all-gathers
  launched until then are the ones it waited for;
- before a unit's backward, FSDP's gradient hook on the unit's outputs waits for the unit's all-gather again (FSDP
  prefetched it in the backward of the unit after it); gradient hooks registered on the same outputs before and
  after FSDP's do the same;
- before a unit's post-backward, FSDP waits for the reduce-scatter still in flight, the previous unit's, before it
  reduces this unit's gradients (FSDP2 keeps one reduce-scatter input buffer: `set_reduce_scatter_max_input_buffers`
  left at its default); a gradient hook on the unit's inputs, which runs just before FSDP's post-backward, marks
  the compute stream;
- at the end of backward FSDP's callback reduce-scatters the units whose inputs need no gradient (the root: token
  ids) and waits for every reduce-scatter. No public hook runs before it, so these waits count from the reduce-
  scatter's own launch: the compute between the first unit's post-backward and the root's (the embedding's
  gradient) counts as waiting where the first unit's reduce-scatter has not ended by then.

Not measured: the gradient norm's all-reduce when clipping (DTensor's, not FSDP's) and any collective of an
evaluation or of a checkpoint save (only training forwards and their backwards are timed).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.distributed.fsdp import FSDPModule, fully_shard

from trainstack.telemetry.comm_timer import CommTimer
from trainstack.telemetry.future_callbacks import FutureCallbacks

REDUCE_SCATTERS = "reduce-scatters"  # the timer's group for every unit's reduce-scatter: each waits for the last


def watch_fsdp_communication(
    model: nn.Module, timer: CommTimer, delay: Callable[[], None], callbacks: FutureCallbacks
) -> bool:
    """Times an FSDP2 model's collectives; False where it is not one or there is no other rank."""
    if not isinstance(model, FSDPModule) or dist.get_world_size() < 2:
        return False
    FsdpCommWatch(model, timer, delay, callbacks)
    return True


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors that need a gradient in a module's inputs or outputs (tensors, tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _grad_tensors(item)]
    return []


class FsdpCommWatch:
    """The hooks. A unit is one `fully_shard` call: one module, or several sharing one FSDP state (Accelerate
    groups the final norm with the output head, and the input embedding where it is tied), keyed by that state
    (`fully_shard.state`) since FSDP all-gathers their parameters together and waits for them at the first of
    them to run."""

    def __init__(self, root: nn.Module, timer: CommTimer, delay: Callable[[], None], callbacks: FutureCallbacks):
        self.timer = timer
        self.delay = delay
        self.callbacks = callbacks
        self.measuring = False
        self._ready: dict[nn.Module, Any] = {}  # module -> its compute-stream mark before FSDP's wait
        self._entered: set[Any] = set()  # the units that have begun their forward in this pass
        scatter = TimedReduceScatter(self)
        units = set()
        for module in root.modules():
            if isinstance(module, FSDPModule):
                unit = fully_shard.state(module)
                if unit not in units:
                    units.add(unit)
                    module.set_custom_all_gather(TimedAllGather(self, unit))
                    module.set_custom_reduce_scatter(scatter)
                self._watch(module, unit)
        root.register_forward_pre_hook(self._pass_started, prepend=True)  # before every hook of the root

    def _watch(self, module: nn.Module, unit: Any) -> None:
        module.register_forward_pre_hook(self._forward_reached, prepend=True)
        module.register_forward_pre_hook(partial(self._forward_waited, unit), with_kwargs=True)
        module.register_forward_hook(partial(self._on_backward, self._backward_reached), prepend=True)
        module.register_forward_hook(partial(self._on_backward, partial(self._backward_waited, unit)))

    def _pass_started(self, root: nn.Module, args: Any) -> None:
        """Only training passes are timed: not an evaluation's forward."""
        self.measuring = root.training and torch.is_grad_enabled()
        self._entered.clear()

    def _forward_reached(self, module: nn.Module, args: Any) -> None:
        if self.measuring:
            self._ready[module] = self.timer.mark()

    def _forward_waited(self, unit: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self.measuring:
            return
        self.timer.waited(self._ready.pop(module), unit)
        if unit in self._entered:
            return
        self._entered.add(unit)
        # The unit's first module to run: FSDP has wrapped its inputs by now, and their gradients reach its
        # post-backward right after this hook.
        if inputs := _grad_tensors((args, kwargs)):
            register_multi_grad_hook(inputs, self._post_backward_reached, mode="all")

    def _post_backward_reached(self, grads: Any) -> None:
        self.timer.waited(self.timer.mark(), REDUCE_SCATTERS)

    def _on_backward(self, hook: Callable[[nn.Module], None], module: nn.Module, args: Any, output: Any) -> None:
        if self.measuring and (outputs := _grad_tensors(output)):
            register_multi_grad_hook(outputs, lambda grad: hook(module), mode="any")

    def _backward_reached(self, module: nn.Module) -> None:
        self._ready[module] = self.timer.mark()

    def _backward_waited(self, unit: Any, module: nn.Module) -> None:
        self.timer.waited(self._ready.pop(module), unit)


class _TimedCollective:
    """One of FSDP's collectives with the timer's marks around it, while a training pass is timed."""

    def __init__(self, watch: FsdpCommWatch, group: Hashable):
        self._watch = watch
        self._group = group

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def _timed(self, tensor: torch.Tensor, run: Callable[[bool], dist.Work | None], async_op: bool) -> dist.Work | None:
        """`tensor`: the collective's larger buffer, whose size it counts."""
        watch = self._watch
        if not watch.measuring:
            return run(async_op)
        # On a CPU rank gloo's collective holds the host, which is the rank's compute, until it ends.
        on_host = tensor.device.type == "cpu"
        collective = watch.timer.launched(
            tensor.numel() * tensor.element_size(), self._group, blocking=on_host and not async_op
        )
        work = run(async_op)
        if work is None:  # done: on the host (gloo), or for the stream FSDP runs it on (NCCL)
            watch.delay()
            watch.timer.done(collective)
        else:  # FSDP waits for it later (an explicit `unshard(async_op=True)`)
            watch.callbacks.then(work.get_future(), lambda future: watch.timer.done(collective))
        return work


class TimedAllGather(_TimedCollective):
    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False
    ) -> dist.Work | None:
        return self._timed(
            output_tensor,
            lambda asynchronous: dist.all_gather_single(
                output_tensor, input_tensor, group=group, async_op=asynchronous
            ),
            async_op,
        )


class TimedReduceScatter(_TimedCollective):
    def __init__(self, watch: FsdpCommWatch):
        super().__init__(watch, REDUCE_SCATTERS)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self._watch.measuring:
            # A reduce-scatter no post-backward hook has paired yet was waited for in FSDP's end-of-backward
            # callback, just before this one's gradients were copied in.
            self._watch.timer.waited_from_launch(REDUCE_SCATTERS)
        return self._timed(
            input_tensor,
            lambda asynchronous: dist.reduce_scatter_single(
                output=output_tensor, input=input_tensor, group=group, op=op, async_op=asynchronous
            ),
            async_op,
        )
