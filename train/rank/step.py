"""One training step: one micro-batch's forward, backward, and at the end of the accumulation (every `grad_accum`
micro-batches, when DDP reduces the gradients) clipping and the optimizer step. The loss and token sums a log
interval reduces across the ranks are trainstack/telemetry/interval.py's, the monitor's own."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from trainstack.train.rank.model import loss_of


def train_step(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict,
    max_grad_norm: float,
    monitor,
) -> torch.Tensor:
    """Returns the micro-batch's loss, detached. `accelerator.sync_gradients` says afterwards whether it stepped."""
    with accelerator.accumulate(model):
        with monitor.forward():
            loss = loss_of(model(**batch))
        accelerator.backward(loss)
        if accelerator.sync_gradients and max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def nonfinite_weights(accelerator: Accelerator, model: torch.nn.Module) -> int:
    """How many of the model's parameters hold an inf or nan, over every rank (each its own shards under FSDP, so
    every rank agrees). One host sync: for a checkpoint's save, where the loss, read before the step's update,
    cannot tell that the update itself diverged."""
    local = [getattr(p, "to_local", lambda p=p: p)() for p in model.parameters()]  # an FSDP2 DTensor: this rank's shard
    found = torch.stack([~torch.isfinite(t).all() for t in local if t.numel()]).sum() if local else torch.tensor(0)
    return int(accelerator.reduce(found.to(accelerator.device), reduction="sum").item())
