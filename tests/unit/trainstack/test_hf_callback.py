"""transformers' Trainer with trainstack's callback (trainstack.integrations.hf), on examples/hf_trainer.py: a
tiny GPT-2 with random init on random token ids, nothing downloaded.

- In one process, a stand-in monitor notes what the callback tells it beside what the Trainer does (each batch it
  collates, each log, each checkpoint it saves): every training batch is made inside a data wait, every evaluation
  and save inside its pause, and each step carries its samples, tokens, epoch and the loss logged before it.
- Under `trainstack watch -- torchrun` on 2 CPU ranks (gloo): both ranks show on watch's exporter as DDP ranks, and
  diagnose calls the run healthy, then input-bound once the collator is slowed on purpose.
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import trainstack.monitor as tsm
from tests.drivers.hf_example import load_example
from trainstack.integrations.hf import TrainstackCallback

BATCH_SIZE, ACCUMULATE, STEPS = 4, 2, 7
TRAIN_SAMPLES = 24  # 3 optimizer steps an epoch: the run crosses two epoch ends
EVAL_BATCHES = 8  # the example's 64 evaluation samples, 8 a batch (the Trainer's default)


# ---- the import ---------------------------------------------------------------------------------------------
def test_without_transformers_the_integration_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` meets when it is absent
    for module in ("trainstack.integrations", "trainstack.integrations.hf"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.import_module("trainstack.integrations")  # the package itself imports no framework
    with pytest.raises(ImportError) as raised:
        importlib.import_module("trainstack.integrations.hf")
    assert str(raised.value) == "trainstack.integrations.hf needs transformers: pip install trainstack[hf]"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_ranks_that_torchrun_started_but_the_trainer_runs_alone_are_named(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(tsm, "start", lambda model, **options: Recorder([]))
    model = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(model=model, model_wrapped=model, accelerator=None, optimizer=None)
    args = SimpleNamespace(world_size=1, train_batch_size=8, eval_on_start=False)
    TrainstackCallback(trainer).on_train_begin(args, SimpleNamespace(global_step=0), control=None)
    assert capsys.readouterr().err == (
        "trainstack: 2 processes were launched but the Trainer is not distributed, so each trains alone; without "
        "GPUs, set TrainingArguments(use_cpu=True) or ACCELERATE_USE_CPU=1\n"
    )


# ---- what the callback tells the monitor, in one process ------------------------------------------------------
class Recorder:
    """Stands in for trainstack.monitor's Monitor: notes each call, in order, in a list the test shares."""

    def __init__(self, events: list[tuple]):
        self.events = events

    def __getattr__(self, method: str):
        return lambda *args, **kwargs: self.events.append((method, *args, kwargs))


def where_things_happen(events: list[tuple]) -> tuple[Counter, list[dict]]:
    """(what happened -> where: inside a data wait, a pause, or neither; each step's figures). Fails on a call out
    of order: a wait or pause opened inside another, closed unopened, or left open at a step or at the end."""
    places: Counter = Counter()
    steps, inside = [], None
    for method, *args, kwargs in events:
        if method in ("data_wait_started", "pause_started"):
            assert inside is None, f"{method} inside {inside}: {events}"
            inside = "data wait" if method == "data_wait_started" else args[0]
        elif method in ("data_ready", "pause_ended"):
            assert inside == ("data wait" if method == "data_ready" else args[0]), f"{method} in {inside}"
            inside = None
        elif method in ("step", "close"):
            assert inside is None, f"{method} inside {inside}"
            if method == "step":
                steps.append({"samples": args[0], **kwargs})
        else:
            places[(method, inside)] += 1
    assert events[-1][0] == "close"
    return places, steps


def noting(name: str, function, events: list[tuple]):
    def noted(*args, **kwargs):
        events.append((name, {}))
        return function(*args, **kwargs)

    return noted


@dataclass
class Recorded:
    events: list[tuple]
    """The Recorder's notes, with the Trainer's collates, logs and saves among them."""
    started: tuple[torch.nn.Module, dict]
    """What trainstack.monitor.start was given."""
    trainer: object


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    """The example's Trainer, run in this process with the callback on a Recorder. Gradient accumulation, an
    evaluation at the start and every 3 steps, a checkpoint every 4, two epoch ends."""
    from transformers import TrainingArguments

    events: list[tuple] = []
    started = []
    example = load_example()
    with pytest.MonkeyPatch.context() as patch:

        def start(model, **options):
            started.append((model, options))
            # As the monitor's DDP and FSDP timing do as it starts: a pre-hook that marks a wait in the forward
            model.register_forward_pre_hook(lambda module, args: events.append(("timing's pre-hook", {})))
            return Recorder(events)

        patch.setattr(tsm, "start", start)
        patch.setattr(example, "collate", noting("collate", example.collate, events))
        args = TrainingArguments(
            output_dir=str(tmp_path_factory.mktemp("hf-recorded")),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH_SIZE,
            gradient_accumulation_steps=ACCUMULATE,
            logging_steps=2,
            eval_strategy="steps",
            eval_steps=3,
            eval_on_start=True,
            save_strategy="steps",
            save_steps=4,
            report_to="none",
            disable_tqdm=True,
            dataloader_pin_memory=False,
        )
        trainer = example.build_trainer(args)
        trainer.train_dataset = example.RandomTokens(TRAIN_SAMPLES, seed=0)
        for method in ("log", "save_model"):  # the Trainer's public methods for logging and saving
            patch.setattr(trainer, method, noting(method, getattr(trainer, method), events))
        trainer.train()
    (start,) = started
    return Recorded(events, start, trainer)


def test_each_training_batch_is_made_inside_a_data_wait_and_each_evaluation_and_save_inside_its_pause(recorded):
    places, steps = where_things_happen(recorded.events)
    evaluations = 1 + 2 + 1  # at the start, at steps 3 and 6, and at the end (step 7)
    saves = 2  # at step 4 and at the end
    micro_batches = STEPS * ACCUMULATE
    assert places[("collate", "evaluation")] == evaluations * EVAL_BATCHES
    # Accelerate's loader fetches one batch ahead, inside the wait for the one before it: the last epoch's
    # loader has made one more batch than the run used.
    assert places[("collate", "data wait")] == micro_batches + 1
    assert places[("save_model", "checkpoint_save")] == saves
    # The loss logged every 2 steps and the summary at the end; each evaluation logs its metrics.
    assert (places[("log", None)], places[("log", "evaluation")]) == (3 + 1, evaluations)
    # Only the training steps' forward passes are timed, none of an evaluation's.
    assert places[("forward_started", None)] == places[("forward_done", None)] == micro_batches
    assert places[("timing's pre-hook", None)] == micro_batches
    assert set(places) == {
        ("timing's pre-hook", None),
        ("timing's pre-hook", "evaluation"),
        ("collate", "evaluation"),
        ("collate", "data wait"),
        ("save_model", "checkpoint_save"),
        ("log", None),
        ("log", "evaluation"),
        ("forward_started", None),
        ("forward_done", None),
    }
    assert len(steps) == STEPS == recorded.trainer.state.global_step


def test_a_training_forward_is_timed_from_before_the_monitors_own_pre_hooks(recorded):
    """The waits the monitor's pre-hooks mark (DDP's buffer broadcast, FSDP's all-gathers) are inside the forward:
    timed from after them, a peer's wait there read as its own forward work."""
    events = [event[0] for event in recorded.events]
    started = [at for at, event in enumerate(events) if event == "forward_started"]
    assert started and all(events[at + 1 : at + 3] == ["timing's pre-hook", "forward_done"] for at in started)


def test_the_monitor_watches_the_wrapped_model_and_its_optimizer(recorded):
    model, options = recorded.started
    trainer = recorded.trainer
    assert model is trainer.model_wrapped
    assert options == {"accelerator": trainer.accelerator, "optimizer": trainer.optimizer}


def test_each_step_carries_its_samples_tokens_epoch_and_the_loss_the_trainer_logged_before_it(recorded):
    _, steps = where_things_happen(recorded.events)
    samples = BATCH_SIZE * ACCUMULATE
    assert [(s["samples"], int(s["tokens"]), s["epoch"]) for s in steps] == [
        (samples, samples * 64, epoch) for epoch in (0, 0, 0, 1, 1, 1, 2)
    ]
    logged = {entry["step"]: entry["loss"] for entry in recorded.trainer.state.log_history if "loss" in entry}
    assert sorted(logged) == [2, 4, 6]
    # A log comes after its step's end: its loss goes with the next step, once.
    assert [s["loss"] for s in steps] == [None, None, logged[2], None, logged[4], None, logged[6]]


def test_a_resumed_run_numbers_its_steps_on_from_the_checkpoint(recorded, monkeypatch):
    events: list[tuple] = []
    monkeypatch.setattr(tsm, "start", lambda model, **options: Recorder(events))
    example = load_example()
    trainer = example.build_trainer(recorded.trainer.args)
    trainer.train_dataset = example.RandomTokens(TRAIN_SAMPLES, seed=0)
    trainer.train(resume_from_checkpoint=str(Path(trainer.args.output_dir) / "checkpoint-4"))
    assert events[0] == ("resumed_at", 4, 1, {})  # step 4 was the first of epoch 1
    assert [event[0] for event in events].count("step") == STEPS - 4
