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
        """One all-reduce: the loss mean over all ranks, their tokens, and whether any must stop. Starts the next
        interval."""
        local_tokens = int(self.tokens.item())
        device = self.loss_sum.device
        stats = torch.stack([
            self.loss_sum.double(), torch.tensor(float(self.micro_batches), device=device).double(),
            torch.tensor(float(local_tokens), device=device).double(),
            torch.tensor(float(stop_requested), device=device).double(),
        ])
        total = accelerator.reduce(stats, reduction="sum").tolist()
        totals = IntervalTotals(loss=total[0] / max(total[1], 1), tokens=int(total[2]), local_tokens=local_tokens,
                                micro_batches=self.micro_batches, stop=total[3] > 0)
        self.loss_sum.zero_()
        self.tokens.zero_()
        self.micro_batches = 0
        return totals
