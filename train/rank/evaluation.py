"""Evaluation: the token-weighted mean loss over the whole held-out set, the same on every rank."""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate import Accelerator

from trainstack.train.rank.data import IGNORE_INDEX
from trainstack.train.rank.model import loss_of


@torch.no_grad()
def mean_loss(accelerator: Accelerator, model: torch.nn.Module, loader) -> float:
    """gather_for_metrics drops the samples that even_batches repeated, so each sample counts once. With logits
    the loss is exact per token; otherwise the model's mean loss is weighted by the batch's tokens."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    for batch in loader:
        output = model(**batch)
        logits = getattr(output, "logits", None)
        labels = batch["labels"][:, 1:]
        counts = (labels != IGNORE_INDEX).sum(dim=1).double()
        if logits is not None:
            per_token = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none"
            )
            sums = per_token.sum(dim=1).double()
        else:
            sums = loss_of(output).double() * counts
        gathered = accelerator.gather_for_metrics(torch.stack([sums, counts], dim=1))
        totals += gathered.sum(dim=0)
    model.train()
    return (totals[0] / totals[1].clamp(min=1)).item()


def evaluator(compiled: bool) -> Callable[[Accelerator, torch.nn.Module, object], float]:
    """A compiled model evaluates eagerly: evaluation is rare, and compiled it would add graphs for eval mode and
    for its shapes."""
    return torch.compiler.set_stance("force_eager")(mean_loss) if compiled else mean_loss
