"""A transformers `Trainer` with no trainstack line: a BatchNorm model over token ids on CPU ranks, nothing
downloaded. tests/process/test_auto_instrument.py and tests/timing/test_watched_matrix.py run it under
`trainstack watch`, which adds trainstack's transformers callback by itself.

    torchrun ... hf_plain.py OUT STEPS             # STEPS healthy optimizer steps
    torchrun ... hf_plain.py OUT STEPS phases      # the PHASES below, STEPS steps each; OUT/phases.json says which
    torchrun ... hf_plain.py OUT STEPS phases NAME # the PHASES up to the one named NAME

In the phases a slow loader sleeps in the collator on every rank; a slowed rank does real work (never a sleep: that
would free its core for its peer) in its model's forward, after its optimizer step (`on_optimizer_step`) or in its
collator, so that its peer waits for it at the next collective: DDP's buffer broadcast and gradient all-reduce, or
the Trainer's gather of the label counts while it fetches a batch (`average_tokens_across_devices`).
"""

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

VOCAB, SEQUENCE, BATCH = 64, 64, 8
WIDTH, DEPTH = 128, 48
"""DEPTH layers of one shared Linear over every token: compute enough that the gradient all-reduce and the Trainer's
gather are a small part of a healthy step on 2 CPU ranks (the model's few parameters alone were comm-bound)."""
EXTRA_SECONDS = 0.1
"""A slowed rank's extra work per step, and a slow loader's wait per batch: much longer than what a shared host's
scheduler shifts between the ranks' own compute (tests/drivers/plain_ddp.py)."""


@dataclass(frozen=True)
class Phase:
    name: str
    slow_in: str = ""
    """loader (every rank's collator sleeps), forward, after_step or data (one rank's extra work); "" healthy."""
    slow_rank: int = -1


HEALTHY = Phase("healthy")
PHASES = [
    Phase("slow-loader", "loader"),
    HEALTHY,
    Phase("forward", "forward", 1),
    Phase("after_step", "after_step", 1),
    Phase("data", "data", 1),
]
"""The slow loader's phase first: the start-up's noise lands in it (the launcher's, watch's and the exporter's own
work on the shared cores), where a 100 ms wait a batch dwarfs it; in a healthy phase's 40 short steps it once named
a rank a straggler at 16%."""


def busy(seconds: float) -> None:
    work = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


class Schedule:
    """Which phase the Trainer is in: its step being made (global_step counts those done) over each phase's steps."""

    def __init__(self, phases: list[Phase], steps_each: int):
        self.phases, self.steps_each = phases, steps_each
        self.trainer: Trainer | None = None

    def slowed_in(self, rank: int) -> str:
        """Where this rank is slowed now ("" if nowhere)."""
        if self.trainer is None:
            return ""
        phase = self.phases[min(self.trainer.state.global_step // self.steps_each, len(self.phases) - 1)]
        return phase.slow_in if phase.slow_rank in (-1, rank) else ""


class Regressor(torch.nn.Module):
    def __init__(self, schedule: Schedule, rank: int):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.mix = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)  # buffers DDP broadcasts at every forward
        self.out = torch.nn.Linear(WIDTH, 1)
        self.schedule, self.rank = schedule, rank

    def forward(self, input_ids, labels=None):
        if self.training and self.schedule.slowed_in(self.rank) == "forward":
            busy(EXTRA_SECONDS)
        hidden = self.embed(input_ids)
        for _ in range(DEPTH):
            hidden = torch.tanh(self.mix(hidden))
        predicted = self.out(self.norm(hidden.mean(1))).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(predicted, labels), "logits": predicted}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, size: int):
        self.ids = torch.randint(0, VOCAB, (size, SEQUENCE), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index].float().mean()}


class SlowAfterOptimizerStep(TrainerCallback):
    def __init__(self, schedule: Schedule, rank: int):
        self.schedule, self.rank = schedule, rank

    def on_optimizer_step(self, args, state, control, **kwargs) -> None:
        if self.schedule.slowed_in(self.rank) == "after_step":
            busy(EXTRA_SECONDS)


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    phases = PHASES if sys.argv[3:4] == ["phases"] else [HEALTHY]
    if len(sys.argv) > 4:
        phases = phases[: [phase.name for phase in phases].index(sys.argv[4]) + 1]
    torch.set_num_threads(1)
    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=steps * len(phases),
        per_device_train_batch_size=BATCH,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    rank = arguments.process_index
    schedule = Schedule(phases, steps)

    def collate(samples: list[dict]) -> dict:
        slow_in = schedule.slowed_in(rank)
        if slow_in == "loader":
            time.sleep(EXTRA_SECONDS)
        elif slow_in == "data":
            busy(EXTRA_SECONDS)
        return torch.utils.data.default_collate(samples)

    trainer = Trainer(
        model=Regressor(schedule, rank),
        args=arguments,
        train_dataset=Tokens(2 * BATCH * steps * len(phases)),
        data_collator=collate,
        callbacks=[SlowAfterOptimizerStep(schedule, rank)],
    )
    schedule.trainer = trainer
    trainer.train()
    if rank == 0:
        written = [asdict(phase) | {"after": n * steps, "upto": (n + 1) * steps} for n, phase in enumerate(phases)]
        (out / "phases.json").write_text(json.dumps({"extra_seconds": EXTRA_SECONDS, "phases": written}))


if __name__ == "__main__":
    main()
