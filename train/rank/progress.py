"""Where a run stands: what each checkpoint records, what a resume restores and what summary.json reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already trained on: where a resume starts reading
    initial_loss: float | None = None
    last_loss: float | None = None
    samples: int = 0  # all ranks
    tokens: int = 0  # all ranks
    resumed_from: str | None = None

    def state(self) -> dict:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "initial_loss": self.initial_loss,
            "last_loss": self.last_loss,
            "samples": self.samples,
            "tokens": self.tokens,
        }
