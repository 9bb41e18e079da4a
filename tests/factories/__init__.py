"""Model and dataset factories for tests: `--model tests.factories:NAME`, `--dataset tests.factories:NAME`.

They exercise the same plug-in path a user's own factory takes. Behaviour that must differ per rank (a slow or
hung rank) is chosen by environment variables, which `accelerate launch` passes to every rank.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from pathlib import Path

import torch
from torch import nn

from bench.factories import RandomBytes
from trainstack.train.rank.model import BUILTIN_MODELS, GPT


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class IndexedSequences(torch.utils.data.Dataset):
    """Sample i starts with token i + 1, so a test can read back which samples each rank trained on."""

    def __init__(self, count: int, length: int = 12):
        self.count, self.length = count, length
        self.vocab_size = count + 2

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": [index + 1] + [(index + k) % self.count + 1 for k in range(1, 2 + index % self.length)]}


def indexed_37(config) -> IndexedSequences:
    """37 samples: divides by no world size x batch size the tests use, so the tail is uneven."""
    return IndexedSequences(37)


class SlowSequences(IndexedSequences):
    """A loader that cannot keep up: each sample costs TRAINSTACK_TEST_SAMPLE_DELAY seconds."""

    def __getitem__(self, index: int) -> dict:
        time.sleep(float(os.environ.get("TRAINSTACK_TEST_SAMPLE_DELAY", "0.02")))
        return super().__getitem__(index)


def slow_dataset(config) -> SlowSequences:
    return SlowSequences(512)


def unreadable_on_rank_0(config) -> IndexedSequences:
    """Rank 0, the main process that fills the datasets cache first, never gets its data (a file system that does
    not answer), while the other ranks wait for it at Accelerate's barrier: a hang before any rank's loop."""
    if _rank() == 0:
        time.sleep(3600)
    return IndexedSequences(64)


class PausingGPT(GPT):
    """Sleeps in forward on the rank named by TRAINSTACK_TEST_SLOW_RANK: a straggler, or a hang if long enough. The
    seconds: TRAINSTACK_TEST_SLOW_SECONDS, or once the file named by TRAINSTACK_TEST_SLOW_FILE exists, its number
    (a test changes a live run's pause by replacing the file)."""

    def forward(self, *args, **kwargs):
        if _rank() == int(os.environ.get("TRAINSTACK_TEST_SLOW_RANK", "-1")):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > int(os.environ.get("TRAINSTACK_TEST_SLOW_AFTER", "0")):
                time.sleep(self._pause_seconds())
        return super().forward(*args, **kwargs)

    @staticmethod
    def _pause_seconds() -> float:
        override = Path(os.environ.get("TRAINSTACK_TEST_SLOW_FILE", "/nonexistent"))
        if override.exists():
            return float(override.read_text())
        return float(os.environ.get("TRAINSTACK_TEST_SLOW_SECONDS", "0.05"))


def pausing_gpt(config, vocab_size: int) -> PausingGPT:
    return PausingGPT(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)


class DiskFullGPT(GPT):
    """On the rank named by TRAINSTACK_TEST_DISK_FULL_RANK, every checkpoint after the first
    TRAINSTACK_TEST_DISK_FULL_AFTER fails as a full disk would (ENOSPC): a full disk where no tmpfs can be mounted."""

    def state_dict(self, *args, **kwargs):
        if _rank() == int(os.environ.get("TRAINSTACK_TEST_DISK_FULL_RANK", "-1")):
            self.saves = getattr(self, "saves", 0) + 1
            if self.saves > int(os.environ.get("TRAINSTACK_TEST_DISK_FULL_AFTER", "0")):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().state_dict(*args, **kwargs)


def disk_full_gpt(config, vocab_size: int) -> DiskFullGPT:
    return DiskFullGPT(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)


class StuckSaveGPT(GPT):
    """On the rank named by TRAINSTACK_TEST_STUCK_SAVE_RANK, the checkpoint write never returns (a file system that
    stopped answering), while the other ranks go on to the collective after it."""

    def state_dict(self, *args, **kwargs):
        if _rank() == int(os.environ.get("TRAINSTACK_TEST_STUCK_SAVE_RANK", "-1")):
            time.sleep(3600)
        return super().state_dict(*args, **kwargs)


def stuck_save_gpt(config, vocab_size: int) -> StuckSaveGPT:
    return StuckSaveGPT(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)


class SlowPausesGPT(GPT):
    """Each checkpoint takes TRAINSTACK_TEST_SAVE_DELAY seconds longer to save (slow storage) and each evaluation
    TRAINSTACK_TEST_EVAL_DELAY seconds longer (a slow evaluation set), on every rank."""

    def state_dict(self, *args, **kwargs):
        time.sleep(float(os.environ.get("TRAINSTACK_TEST_SAVE_DELAY", "0")))
        return super().state_dict(*args, **kwargs)

    def train(self, mode: bool = True):
        if not mode:  # model.eval(): once per evaluation
            time.sleep(float(os.environ.get("TRAINSTACK_TEST_EVAL_DELAY", "0")))
        return super().train(mode)


def slow_pauses_gpt(config, vocab_size: int) -> SlowPausesGPT:
    return SlowPausesGPT(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)


class WithUnusedParameter(GPT):
    """A head that forward never calls: DDP cannot reduce its gradient unless find_unused_parameters is on."""

    def __init__(self, *args):
        super().__init__(*args)
        self.unused_head = nn.Linear(self.shape.width, 4)


def with_unused_parameter(config, vocab_size: int) -> WithUnusedParameter:
    return WithUnusedParameter(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)


class BatchNormLM(nn.Module):
    """A small next-token model with BatchNorm, the layer SyncBatchNorm replaces."""

    def __init__(self, vocab_size: int, width: int = 32):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width)
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None):
        hidden = self.norm(self.embedding(input_ids).transpose(1, 2)).transpose(1, 2)
        logits = self.head(hidden)
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )


def batchnorm_lm(config, vocab_size: int) -> BatchNormLM:
    return BatchNormLM(vocab_size)


def not_a_module(config, vocab_size: int) -> str:
    return "not a model"


class BusyRandomBytes(RandomBytes):
    """RandomBytes whose delay spins instead of sleeping: with no loader workers the rank itself holds its core while
    it waits, as it does while it computes, so the host's other processes and the caches meet the same rank whether
    the delay is on or off, and removing it changes the step by the wait alone."""

    def __getitem__(self, index: int) -> dict:
        deadline = time.perf_counter() + self.delay
        while time.perf_counter() < deadline:
            pass
        return {"input_ids": list(self.samples[index])}


def busy_random_bytes(config) -> BusyRandomBytes:
    return BusyRandomBytes(1024, config.seq_len)


@dataclasses.dataclass
class UnregisteredOutput:
    """A dataclass the model returns without registering it as a pytree: DDP's static graph cannot look into it."""

    loss: torch.Tensor


class UnregisteredOutputGPT(GPT):
    def forward(self, *args, **kwargs):
        return UnregisteredOutput(super().forward(*args, **kwargs).loss)


def unregistered_output_gpt(config, vocab_size: int) -> UnregisteredOutputGPT:
    return UnregisteredOutputGPT(BUILTIN_MODELS["tiny-gpt"], vocab_size, config.seq_len)
