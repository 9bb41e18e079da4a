"""The models and datasets of the GPU benchmarks and the GPU tests (docs/benchmarks.md): `--model
bench.factories:gpt2_small`, `--dataset bench.factories:random_bytes`, named as a user names their own factory."""

from __future__ import annotations

import os
import random
import time

import torch

from trainstack.train.rank.data import BYTE_VOCAB
from trainstack.train.rank.model import GPT, GPTShape


class RandomBytes(torch.utils.data.Dataset):
    """Byte text whose every line fills --seq-len: fixed-length batches, as in the GPU runs of issue 12. A sample
    costs TRAINSTACK_TEST_SAMPLE_DELAY seconds (default none) to load: a loader slowed on purpose."""

    vocab_size = BYTE_VOCAB

    def __init__(self, count: int, length: int, seed: int = 0):
        rng = random.Random(seed)
        self.samples = [rng.randbytes(length) for _ in range(count)]
        self.delay = float(os.environ.get("TRAINSTACK_TEST_SAMPLE_DELAY", "0"))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        if self.delay:
            time.sleep(self.delay)
        return {"input_ids": list(self.samples[index])}


def random_bytes(config) -> RandomBytes:
    return RandomBytes(8192, config.seq_len)  # 8 MB at --seq-len 1024: an epoch outlasts the GPU tests' runs


def gpt2_small(config, vocab_size: int) -> GPT:
    """GPT-2 small's shape (12 layers, 12 heads, width 768) on the built-in GPT."""
    return GPT(GPTShape(12, 12, 768), vocab_size, config.seq_len)
