"""Where a run stands: what each checkpoint records, what a resume restores and what summary.json reports."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    evaluations: list[dict] = field(default_factory=list)  # {"step", "loss"}: each evaluation's mean loss, in order

    def state(self) -> dict:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "initial_loss": self.initial_loss,
            "last_loss": self.last_loss,
            "samples": self.samples,
            "tokens": self.tokens,
            "evaluations": self.evaluations,
        }
