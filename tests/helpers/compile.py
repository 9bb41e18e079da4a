"""The built-in model at its smallest, seeded, for what torch.compile does to it."""

from __future__ import annotations

import torch

from trainstack.train.rank.model import BUILTIN_MODELS, GPT


def tiny_gpt(seq_len: int) -> GPT:
    torch.manual_seed(0)
    return GPT(BUILTIN_MODELS["tiny-gpt"], 64, seq_len)
