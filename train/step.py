"""One training step, and the sums a log interval reduces across the ranks.

`train_step` is one micro-batch: forward, backward, and at the end of the accumulation (every `grad_accum`
micro-batches, when DDP reduces the gradients) clipping and the optimizer step. `IntervalSums` keeps the loss and
token sums on the device, so that no step waits for the host, until the log interval's one all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator

from train.model import loss_of


def train_step(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict,
               max_grad_norm: float, telemetry) -> torch.Tensor:
    """Returns the micro-batch's loss, detached. `accelerator.sync_gradients` says afterwards whether it stepped."""
    with accelerator.accumulate(model):
        telemetry.forward_started()
        loss = loss_of(model(**batch))
        telemetry.forward_done()
        accelerator.backward(loss)
        if accelerator.sync_gradients and max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@dataclass(frozen=True)
class IntervalTotals:
    loss: float  # the mean over every rank's micro-batches
    tokens: int  # all ranks
    local_tokens: int  # this rank's
    micro_batches: int  # this rank's
    stop: bool  # some rank was asked to stop


class IntervalSums:
    def __init__(self, device: torch.device):
        self.loss_sum = torch.zeros((), device=device)
        self.tokens = torch.zeros((), device=device, dtype=torch.long)
        self.micro_batches = 0

    def add(self, loss: torch.Tensor, batch: dict) -> None:
        self.loss_sum += loss.float()
        self.tokens += batch["attention_mask"].sum()
        self.micro_batches += 1

    def reduce(self, accelerator: Accelerator, stop_requested: bool) -> IntervalTotals:
        """One all-reduce and one read back to the host (a sync: the GPU idles until the host queues the next
        step, so there is no second one): the loss mean over all ranks, their tokens, whether any must stop, and
        this rank's own tokens. Starts the next interval."""
        device = self.loss_sum.device
        sums = torch.stack([self.loss_sum.double(), self.tokens.double()])
        counts = torch.tensor([float(self.micro_batches), float(stop_requested)], dtype=torch.float64, device=device)
        reduced = accelerator.reduce(torch.cat([sums, counts]), reduction="sum")
        loss, tokens, micro_batches, stop, local_tokens = torch.cat([reduced, sums[1:]]).tolist()
        totals = IntervalTotals(loss=loss / max(micro_batches, 1), tokens=int(tokens), local_tokens=int(local_tokens),
                                micro_batches=self.micro_batches, stop=stop > 0)
        self.loss_sum.zero_()
        self.tokens.zero_()
        self.micro_batches = 0
        return totals
