"""The learning-rate schedule: linear warm-up, then cosine, linear or constant decay to the last step."""

from __future__ import annotations

import math
from functools import partial

import torch


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The share of the peak learning rate at an optimizer step (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = max(total_steps - warmup_steps, 1)
    done = min((step - warmup_steps) / remaining, 1.0)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * done))
    if schedule == "linear":
        return 1 - done
    return 1.0


def lr_scheduler(optimizer: torch.optim.Optimizer, config, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    # A partial, not a closure: LambdaLR saves a partial's (empty) __dict__ in its state_dict, as it did the
    # Trainer's bound method before; the steps come from this launch's config, never from the checkpoint.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        partial(lr_factor, warmup_steps=config.warmup_steps, total_steps=total_steps, schedule=config.lr_schedule),
    )
