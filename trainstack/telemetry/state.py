"""The bytes of training state a rank holds (parameters, gradients, optimizer state: its shards under FSDP),
measured once, right after the first optimizer step."""

from __future__ import annotations

from collections.abc import Callable

import torch


def local_bytes(tensors) -> int:
    """Bytes of the tensors this rank holds: a sharded parameter (a DTensor) counts its local shard only."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def training_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Measured right after an optimizer step: gradients are not yet freed and the optimizer state exists.
    model.parameters() lists a tied weight once, as it is stored once."""
    parameters = list(model.parameters())
    return {
        "param_bytes": local_bytes(parameters),
        "grad_bytes": local_bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer_state_bytes": local_bytes(
            value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)
        ),
    }


def measure_state_once(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, measured: Callable[[dict[str, int]], None]
) -> None:
    """At the first optimizer step, once, into `measured`: the bytes of parameters, gradients and optimizer state stay the same for
    the rest of the run, and only right after a step do the gradients and the optimizer state all exist."""

    def measure(inner: torch.optim.Optimizer, args, kwargs) -> None:
        handle.remove()
        measured(training_state_bytes(model, inner))

    handle = optimizer.register_step_post_hook(measure)
