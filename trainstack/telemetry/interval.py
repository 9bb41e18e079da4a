"""A log interval: when it ends, its counts at the cut, and its loss and tokens, summed where they are and read
later.

Every loop sums each micro-batch's loss and tokens into `IntervalSums`: a device tensor with one in-place add on
the device (the cheapest thing a step can do with it without waiting for it), a number on the host. At the end of
an interval the sums are queued to the host (on a GPU a copy into page-locked memory, so it need not block, with an
event after it) and the next interval starts; the loop reads them after it has queued the next step, so the GPU
has that step to run while the host waits for the totals and then logs them. Read at once, the GPU would sit idle
from the end of the interval until the host had logged and queued again.

A rank's monitor (trainstack.monitor) keeps the one sum of its loop's loss and tokens, and closes it at each
interval's end: into this rank's own totals (`take`), or, where the loop asks the monitor for it, into every rank's
(`start_reduce`): trainstack's Trainer does, for its progress bar, and that reduction is the one cross-rank traffic
of its loop, which carries the loss, the tokens and the stop flag together. Either way the totals keep this rank's
own loss and tokens, which its records and series show.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainstack.telemetry.clock import PendingTimes

LOSS, TOKENS, LOSSES, STOP = range(4)
"""The places of an interval's sums in the vector a reduction sums across the ranks; this rank's own loss and tokens
follow them in the totals."""


def interval_ends(step: int, log_every: int) -> bool:
    """Whether the loop closes a log interval after optimizer step `step`: every `log_every` steps, and after the
    first, so that a run shows its first loss (and its startup's cost) at once."""
    return step % log_every == 0 or step == 1


@dataclass(frozen=True)
class IntervalCut:
    """A log interval's counts, taken between its last step and the next one."""

    samples: int
    times: PendingTimes  # step, data-wait and forward times, on the rank's clock (clock.py)
    forward_passes: int
    host_data_wait: float
    comm_steps: list | None  # the steps' gradient-communication marks (CommTimer.cut); None where unmeasured
    # Its time outside its steps (wall_time.py's NotStepping):
    step_count: int
    compile_seconds: float
    paused: list[dict]
    not_stepping: list[tuple[float, float]]


@dataclass(frozen=True)
class IntervalTotals:
    loss: float | None  # the mean over the micro-batches that gave one (every rank's, when reduced); None: none did
    tokens: int  # every rank's, when reduced
    local_loss: float | None  # this rank's mean
    local_tokens: int  # this rank's
    micro_batches: int  # this rank's
    stop: bool  # some rank was asked to stop (only a reduction carries it)


class IntervalSums:
    def __init__(self, device: torch.device | None = None):
        """`device`: where a reduction runs (the accelerator's); by default, where the sums are."""
        self._device = device
        self._reset()

    def _reset(self) -> None:
        self.micro_batches = 0
        self._losses = 0  # micro-batches that gave a loss
        self._host = [0.0, 0.0]  # loss, tokens
        self._on_device: list[torch.Tensor | None] = [None, None]  # loss (float32), tokens (int64)

    def add(self, loss: float | torch.Tensor | None, tokens: int | torch.Tensor | None) -> None:
        """A micro-batch's loss and tokens; a device tensor is summed on the device, never read here."""
        self.micro_batches += 1
        if loss is not None:
            self._losses += 1
        for slot, value in enumerate((loss, tokens)):
            if isinstance(value, torch.Tensor):
                total, value = self._on_device[slot], value.detach()
                if total is None:
                    self._on_device[slot] = value.sum(dtype=torch.float32 if slot == LOSS else torch.int64)
                    continue
                value = value.sum() if value.dim() else value
                total.add_(value if value.dtype == total.dtype else value.to(total.dtype))
            elif value is not None:
                self._host[slot] += float(value)

    def take(self) -> PendingTotals:
        """This rank's sums on their way to the host; the next interval starts."""
        on_device = [value for value in self._on_device if value is not None]
        values = self._stacked(on_device[0].device) if on_device else None
        pending = PendingTotals(
            values, [*self._host, float(self._losses), 0.0], self.micro_batches, self._losses, reduced=False
        )
        self._reset()
        return pending

    def start_reduce(self, accelerator, stop_requested: bool) -> PendingTotals:
        """Queues one all-reduce (the loss mean over all ranks, their tokens, whether any must stop) and the copy of
        its result, with this rank's own loss and tokens, to the host; the next interval starts."""
        device = self._device or next(
            (value.device for value in self._on_device if value is not None), accelerator.device
        )
        # Built on the host and copied without blocking: torch.tensor(..., device=cuda) copies from pageable memory
        # and so waits for the whole queued interval (seen on an H100), leaving the GPU idle until the next is queued.
        on_gpu = device.type == "cuda"
        local = torch.tensor(
            [*self._host, float(self._losses), float(stop_requested)], dtype=torch.float64, pin_memory=on_gpu
        ).to(device, non_blocking=on_gpu)
        local[LOSS : TOKENS + 1] += self._stacked(device)
        own = local[LOSS : TOKENS + 1].clone()
        values = torch.cat([accelerator.reduce(local, reduction="sum"), own])
        pending = PendingTotals(values, [0.0] * 6, self.micro_batches, self._losses, reduced=True)
        self._reset()
        return pending

    def _stacked(self, device: torch.device) -> torch.Tensor:
        """The device sums, loss and tokens, as one float64 vector on `device` (zero where the host has them)."""
        return torch.stack(
            [
                torch.zeros((), dtype=torch.float64, device=device) if value is None else value.to(torch.float64)
                for value in self._on_device
            ]
        )


class PendingTotals:
    """An interval's totals on their way to the host. On a GPU the copy is queued behind the interval's work (into
    page-locked memory, so that it need not block) with an event after it; elsewhere they are there already."""

    def __init__(
        self, values: torch.Tensor | None, host: list[float], micro_batches: int, local_losses: int, reduced: bool
    ):
        """`values` (None: all on the host) are added, place by place, to `host` when read: loss, tokens, losses,
        stop, and after a reduction this rank's own loss and tokens. `local_losses`: this rank's micro-batches that
        gave a loss."""
        self._host, self._micro_batches, self._local_losses, self._reduced = host, micro_batches, local_losses, reduced
        self._values, self._copied = values, None
        if values is not None and values.device.type == "cuda":
            self._values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._values.copy_(values, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def result(self) -> IntervalTotals:
        """Waits, if need be, until the device has run the interval (and its reduction)."""
        if self._copied is not None:
            self._copied.synchronize()
        values = list(self._host)
        for place, value in enumerate([] if self._values is None else self._values.tolist()):
            values[place] += value
        loss, tokens, losses, stop, *own = values
        local_loss, local_tokens = own if self._reduced else (loss, tokens)
        return IntervalTotals(
            loss=loss / losses if losses else None,
            tokens=int(tokens),
            local_loss=local_loss / self._local_losses if self._local_losses else None,
            local_tokens=int(local_tokens),
            micro_batches=self._micro_batches,
            stop=stop > 0,
        )
