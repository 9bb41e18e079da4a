"""A Lightning `Trainer(strategy="ddp")` on 2 CPU ranks with no trainstack line: under `trainstack watch` the
automatic instrumentation adds trainstack's callback to it (trainstack/auto/). tests/timing/test_watched_matrix.py
runs it started by torchrun and by Lightning itself (`python this.py`, devices=2):

    python tests/drivers/lightning_example.py OUT          # or: torchrun --nproc-per-node 2 ... OUT
    python tests/drivers/lightning_example.py OUT NAME     # the PHASES up to the one named NAME

One fit (a process holds one monitor under watch) through the PHASES below, one after another, with gradient
accumulation, a validation every few optimizer steps and a checkpoint every few more: healthy; a slow loader (its
collate sleeps, on both ranks); then rank 1 given real work (never a sleep: that would free its core for its peer)
in its forward passes, after its optimizer step, and in its loader, so that rank 0 waits for it at the next
collective (DDP's buffer broadcast and gradient all-reduce, or Lightning's stop-flag broadcast before each fetch).
The model has a BatchNorm (DDP broadcasts its buffers in every forward) over embedded token ids, so each batch's
tokens are its ids. OUT/expected.json says what each rank should record and which steps each phase took.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset, default_collate

BATCH, SEQUENCE, ACCUMULATE = 8, 64, 2
# Compute enough per step that gloo's collectives (the gradient all-reduce, the stop flag) are a small part of it
WIDTH, DEPTH = 128, 64
VALIDATE_EVERY, SAVE_EVERY = 8, 16  # optimizer steps
# The callback's interval, in optimizer steps: watch's --log-every (no trainstack line here, so its name as is)
LOG_EVERY = int(os.environ.get("TRAINSTACK_LOG_EVERY", "10"))
EXTRA_SECONDS = 0.1
"""Per optimizer step: a slowed rank's extra work (spread over its micro-batches), much longer than what a shared
host's scheduler shifts between the ranks' own compute (tests/drivers/plain_ddp.py)."""
LOADER_SECONDS = 0.05
"""Per micro-batch: a slow loader's wait, 100 ms an optimizer step (about as long as its compute)."""


@dataclass(frozen=True)
class Phase:
    name: str
    steps: int
    slow_in: str = ""
    """loader (every rank), forward, after_step or data (rank `slow_rank` alone); "" for a healthy phase."""
    slow_rank: int = -1


PHASES = [
    Phase("healthy", 20),  # a validation and a checkpoint among its steps
    Phase("slow-loader", 20, "loader"),
    Phase("forward", 20, "forward", 1),
    Phase("after_step", 20, "after_step", 1),
    Phase("data", 20, "data", 1),
]
"""20 steps a phase: with watch's --log-every 5, three intervals judged after the first, as the plain loop's. At 15
(two judged), five matrix runs judged a slowed phase again three times, twice a Lightning one."""


class Schedule:
    """Which of `phases` the fit is in, from its optimizer steps done; where this rank is slowed in it."""

    def __init__(self, phases: list[Phase] = PHASES):
        self.phases = phases
        self.trainer: pl.Trainer | None = None

    def slowed_in(self, done: int | None = None) -> str:
        """Where this rank is slowed in the step made after `done` optimizer steps (default: the trainer's)."""
        if self.trainer is None:
            return ""
        step, ends = self.trainer.global_step if done is None else done, 0
        for phase in self.phases:
            ends += phase.steps
            if step < ends:
                return phase.slow_in if phase.slow_rank in (-1, self.trainer.global_rank) else ""
        return ""


class Tokens(Dataset):
    def __init__(self, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (samples, SEQUENCE), generator=generator)
        self.targets = torch.randn(samples, generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        return self.ids[index], self.targets[index]


class Regressor(pl.LightningModule):
    def __init__(self, schedule: Schedule | None = None):
        super().__init__()
        self.schedule = schedule or Schedule()
        self.embed = torch.nn.Embedding(100, WIDTH)
        self.mix = torch.nn.Linear(WIDTH, WIDTH)  # applied DEPTH times to every token: work without parameters
        self.norm = torch.nn.BatchNorm1d(WIDTH)  # buffers DDP broadcasts at every forward
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.training and self.schedule.slowed_in() == "forward":
            busy(EXTRA_SECONDS / ACCUMULATE)
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


class SlowAfterOptimizerStep(pl.Callback):
    def __init__(self, schedule: Schedule):
        self.schedule = schedule

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stepped = (batch_idx + 1) % ACCUMULATE == 0  # this micro-batch ended an accumulation: the optimizer stepped
        if stepped and self.schedule.slowed_in(trainer.global_step - 1) == "after_step":
            busy(EXTRA_SECONDS)


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    phases = PHASES[: [phase.name for phase in PHASES].index(sys.argv[2]) + 1] if len(sys.argv) > 2 else PHASES
    steps = sum(phase.steps for phase in phases)
    schedule = Schedule(phases)

    def collate(samples):
        slow_in = schedule.slowed_in()
        if slow_in == "loader":
            time.sleep(LOADER_SECONDS)  # input work on every rank (the loader has no workers)
        elif slow_in == "data":
            busy(EXTRA_SECONDS / ACCUMULATE)
        return default_collate(samples)

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
            SlowAfterOptimizerStep(schedule),
            ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=SAVE_EVERY, save_top_k=-1),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=out,
    )
    schedule.trainer = trainer
    train = Tokens(2 * BATCH * ACCUMULATE * steps)  # one epoch: each rank sees half of it
    loader = DataLoader(train, batch_size=BATCH, collate_fn=collate)
    trainer.fit(Regressor(schedule), loader, DataLoader(Tokens(4 * BATCH), batch_size=BATCH))
    if trainer.global_rank == 0:
        written, after = [], 0
        for phase in phases:
            written.append(asdict(phase) | {"after": after, "upto": after + phase.steps})
            after += phase.steps
        expected = {
            "extra_seconds": EXTRA_SECONDS,
            "phases": written,
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
