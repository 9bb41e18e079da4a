"""One training step, and the sums a log interval reduces across the ranks.

`train_step` is one micro-batch: forward, backward, and at the end of the accumulation (every `grad_accum`
micro-batches, when DDP reduces the gradients) clipping and the optimizer step. `IntervalSums` keeps the loss and
token sums on the device, so that no step waits for the host. At the end of a log interval it queues their one
all-reduce and a copy of the result to the host, and returns at once: the loop reads the totals after it has
queued the next step, so the GPU has that step to run while the host waits for the totals and then logs them.
Read at once, the GPU would sit idle from the end of the interval until the host had logged and queued again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator

from trainstack.train.rank.model import loss_of


def train_step(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict,
               max_grad_norm: float, monitor) -> torch.Tensor:
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

    def add(self, loss: torch.Tensor, tokens: torch.Tensor) -> None:
        self.loss_sum += loss.float()
        self.tokens += tokens
        self.micro_batches += 1

    def start_reduce(self, accelerator: Accelerator, stop_requested: bool) -> PendingTotals:
        """Queues one all-reduce (the loss mean over all ranks, their tokens, whether any must stop) and the copy
        of its result, with this rank's own tokens, to the host; starts the next interval."""
        device = self.loss_sum.device
        sums = torch.stack([self.loss_sum.double(), self.tokens.double()])
        counts = torch.tensor([float(self.micro_batches), float(stop_requested)], dtype=torch.float64, device=device)
        reduced = accelerator.reduce(torch.cat([sums, counts]), reduction="sum")
        pending = PendingTotals(torch.cat([reduced, sums[1:]]), self.micro_batches)
        self.loss_sum.zero_()
        self.tokens.zero_()
        self.micro_batches = 0
        return pending


class PendingTotals:
    """An interval's totals on their way to the host. On a GPU the copy is queued behind the reduction (into
    page-locked memory, so that it need not block) with an event after it; elsewhere they are there already."""

    def __init__(self, values: torch.Tensor, micro_batches: int):
        self._micro_batches = micro_batches
        self._copied = None
        if values.device.type == "cuda":
            self._values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._values.copy_(values, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            self._values = values

    def result(self) -> IntervalTotals:
        """Waits, if need be, until the device has run the interval's steps and its reduction."""
        if self._copied is not None:
            self._copied.synchronize()
        loss, tokens, micro_batches, stop, local_tokens = self._values.tolist()
        return IntervalTotals(loss=loss / max(micro_batches, 1), tokens=int(tokens), local_tokens=int(local_tokens),
                              micro_batches=self._micro_batches, stop=stop > 0)
