"""A Lightning `Trainer(strategy="ddp")` on 2 CPU ranks with trainstack's callback, as tests/timing/test_lightning_callback.py
runs it under `trainstack watch`, started by torchrun or by Lightning itself (`python this.py`, devices=2):

    python tests/drivers/lightning_example.py OUT          # or: torchrun --nproc-per-node 2 ... OUT

One fit, three phases (a process holds one monitor under watch, so one fit): HEALTHY_STEPS optimizer steps with
gradient accumulation, a validation every few steps and a checkpoint every few more; STRAGGLER_STEPS in which rank 1
does real work after each micro-batch, so rank 0 waits for it at the next step's first collective (Lightning's
stop-flag broadcast, before the fetch); then SLOW_STEPS in which every sample's __getitem__ sleeps, on both ranks. The model has a BatchNorm (DDP broadcasts its buffers in every forward)
over embedded token ids, so each batch's tokens are its ids. OUT/expected.json says what each rank should record.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from trainstack.integrations.lightning import TrainstackCallback

BATCH, SEQUENCE, ACCUMULATE = 8, 64, 2
# Compute enough per step that gloo's collectives (the gradient all-reduce, the stop flag) are a small part of it
WIDTH, DEPTH = 128, 64
HEALTHY_STEPS, STRAGGLER_STEPS, SLOW_STEPS = 40, 10, 10  # optimizer steps; each phase starts an interval
VALIDATE_EVERY, SAVE_EVERY = 15, 30  # optimizer steps
LOG_EVERY = 5
SLOW_SECONDS = 0.015  # per sample: 120 ms a micro-batch of 8, against ~50 ms of work
STRAGGLER_SECONDS = 0.03  # rank 1's extra work after each micro-batch


class Tokens(Dataset):
    def __init__(self, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (samples, SEQUENCE), generator=generator)
        self.targets = torch.randn(samples, generator=generator)
        self.delay = 0.0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)  # real input work, on every rank (the loader has no workers: this process)
        return self.ids[index], self.targets[index]


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, WIDTH)
        self.mix = torch.nn.Linear(WIDTH, WIDTH)  # applied DEPTH times to every token: work without parameters
        self.norm = torch.nn.BatchNorm1d(WIDTH)  # buffers DDP broadcasts at every forward
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for _ in range(DEPTH):
            hidden = torch.tanh(self.mix(hidden))
        return self.head(self.norm(hidden.mean(dim=1))).squeeze(1)

    def training_step(self, batch, batch_idx):
        ids, targets = batch
        return torch.nn.functional.mse_loss(self(ids), targets)

    def validation_step(self, batch, batch_idx):
        ids, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(ids), targets), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def busy(seconds: float) -> None:
    """Real work on the CPU, not a sleep: a slow rank's own computation."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class Phases(pl.Callback):
    """Slows rank 1 after its micro-batches from step HEALTHY_STEPS on, then the loader on both ranks."""

    def __init__(self, dataset: Tokens):
        self.dataset = dataset

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step  # optimizer steps done
        if HEALTHY_STEPS <= step < HEALTHY_STEPS + STRAGGLER_STEPS and trainer.global_rank == 1:
            busy(STRAGGLER_SECONDS)
        if step >= HEALTHY_STEPS + STRAGGLER_STEPS:
            self.dataset.delay = SLOW_SECONDS


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    steps = HEALTHY_STEPS + STRAGGLER_STEPS + SLOW_STEPS
    train = Tokens(2 * BATCH * ACCUMULATE * steps)  # one epoch: each rank sees half of it
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_steps=steps,
        accumulate_grad_batches=ACCUMULATE,
        val_check_interval=VALIDATE_EVERY * ACCUMULATE,  # counts micro-batches
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[
            TrainstackCallback(log_every=LOG_EVERY),
            Phases(train),
            ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=SAVE_EVERY, save_top_k=-1),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=out,
    )
    trainer.fit(Regressor(), DataLoader(train, batch_size=BATCH), DataLoader(Tokens(4 * BATCH), batch_size=BATCH))
    if trainer.global_rank == 0:
        expected = {
            "phases": {  # the optimizer steps each phase ends at
                "healthy": HEALTHY_STEPS,
                "straggler": HEALTHY_STEPS + STRAGGLER_STEPS,
                "slow-loader": steps,
            },
            "steps": steps,
            "log_every": LOG_EVERY,
            "samples_per_step": BATCH * ACCUMULATE,
            "tokens_per_step": BATCH * ACCUMULATE * SEQUENCE,
            "validations": [step for step in range(1, steps + 1) if step % VALIDATE_EVERY == 0],
            "saves": [step for step in range(1, steps + 1) if step % SAVE_EVERY == 0],
        }
        (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main()
