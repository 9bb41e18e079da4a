"""Lightning's Trainer with trainstack's callback (trainstack.integrations.lightning), in one process on a stand-in
monitor: every training fetch inside a data wait, every validation and save inside its pause, each optimizer step
with its micro-batches; a resumed fit numbered on; a second fit, or a strategy holding DDP's one comm hook, left
unrecorded with one line; what the callback reads from a batch; the import's message without Lightning. The same
callback on 2 ranks under `trainstack watch`: tests/timing/test_watched_matrix.py."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

import trainstack.integrations.lightning_hooks as lightning_hooks
import trainstack.monitor as tsm
from trainstack.integrations.lightning import TrainstackCallback


# ---- in one process -------------------------------------------------------------------------------------------
def test_without_lightning_the_integration_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # what `import lightning` meets when it is absent
    for module in ("lightning.pytorch", "trainstack.integrations", "trainstack.integrations.lightning"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.import_module("trainstack.integrations")  # the package itself imports no framework
    with pytest.raises(ImportError) as raised:
        importlib.import_module("trainstack.integrations.lightning")
    assert str(raised.value) == ("trainstack.integrations.lightning needs lightning: pip install trainstack[lightning]")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def samples_and_tokens(batch):
    return lightning_hooks.samples_and_tokens(batch, pl.utilities.data.extract_batch_size)


def test_a_batch_gives_its_samples_and_its_tokens():
    ids = torch.randint(0, 100, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[:, 10:] = 0
    assert samples_and_tokens((ids, torch.randn(4))) == (4, 64)  # token ids: every one counts
    samples, tokens = samples_and_tokens({"input_ids": ids, "attention_mask": mask, "labels": ids})
    assert (samples, int(tokens)) == (4, 40)  # the mask's sum, left a tensor: no host sync
    assert isinstance(tokens, torch.Tensor)
    assert samples_and_tokens([torch.randn(4, 3), torch.randn(4)]) == (4, 0)  # features, not tokens
    assert samples_and_tokens({"pixels": torch.randn(2, 3, 8, 8)}) == (2, 0)


class Recorder(tsm.Monitor):
    """Stands in for a Monitor (a real one is made only in a watched run): notes each call, in order."""

    def __init__(self, events: list[tuple]):  # no telemetry: nothing is recorded
        self.events = events

    def __getattribute__(self, name: str):
        if name in MONITOR_CALLS:
            return lambda *args, **kwargs: object.__getattribute__(self, "events").append((name, *args, kwargs))
        return object.__getattribute__(self, name)


MONITOR_CALLS = {
    "data_wait_started",
    "data_ready",
    "forward_started",
    "forward_done",
    "micro_batch",
    "step",
    "resumed_at",
    "pause_started",
    "pause_ended",
    "close",
}


class Noted(torch.utils.data.Dataset):
    def __init__(self, name: str, dataset, events: list[tuple]):
        self.name, self.dataset, self.events = name, dataset, events

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        self.events.append((self.name, {}))
        return self.dataset[index]


class NoteSaves(pl.Callback):
    def __init__(self, events: list[tuple]):
        self.events = events

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.events.append(("save", {}))


def where_things_happen(events: list[tuple]) -> tuple[Counter, list[tuple]]:
    """(what happened -> inside a data wait, a pause or neither; the steps and micro-batches in order). Fails on a
    wait or pause opened inside another, closed unopened, or left open at a step or at the end."""
    places: Counter = Counter()
    steps, inside = [], None
    for method, *args, kwargs in events:
        if method in ("data_wait_started", "pause_started"):
            assert inside is None, f"{method} inside {inside}"
            inside = "data wait" if method == "data_wait_started" else args[0]
        elif method in ("data_ready", "pause_ended"):
            assert inside == ("data wait" if method == "data_ready" else args[0]), f"{method} in {inside}"
            inside = None
        elif method in ("step", "micro_batch", "close"):
            assert inside is None, f"{method} inside {inside}"
            steps.append((method, *args, kwargs))
        else:
            places[(method, inside)] += 1
    assert events[-1][0] == "close"
    return places, steps


def test_in_one_process_fetches_are_data_waits_validations_and_saves_pauses_and_steps_carry_micro_batches(
    tmp_path, monkeypatch, capsys
):
    from tests.drivers import lightning_example as example

    events: list[tuple] = []
    monkeypatch.setattr(tsm, "start", lambda model, **options: Recorder(events))
    monkeypatch.setattr(lightning_hooks, "_process", {"recorded": False})
    steps, accumulate, batch = 6, 2, 4
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        val_check_interval=3 * accumulate,  # micro-batches: after steps 3 and 6
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[
            TrainstackCallback(),
            NoteSaves(events),
            ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=tmp_path,
    )
    train = Noted("fetch", example.Tokens(batch * accumulate * steps), events)
    validate = Noted("validation fetch", example.Tokens(2 * batch), events)
    trainer.fit(example.Regressor(), DataLoader(train, batch_size=batch), DataLoader(validate, batch_size=batch))
    places, stepped = where_things_happen(events)
    micro_batches = steps * accumulate
    assert places == {
        ("fetch", "data wait"): micro_batches * batch,  # every sample of every training batch, in a data wait
        ("validation fetch", "evaluation"): 2 * 2 * batch,
        ("save", "checkpoint_save"): 1,
        ("forward_started", None): micro_batches,  # no validation forward
        ("forward_done", None): micro_batches,
    }
    tokens = batch * example.SEQUENCE
    assert [(call[0], call[1] if call[0] == "step" else None) for call in stepped] == [
        ("micro_batch", None),
        ("step", batch * accumulate),
    ] * steps + [("close", None)]
    assert {call[-1]["tokens"] for call in stepped if call[0] != "close"} == {tokens}  # each micro-batch's own
    assert all(isinstance(call[-1]["loss"], torch.Tensor) for call in stepped if call[0] != "close")
    # The profiler and save_checkpoint are the trainer's own again.
    assert "save_checkpoint" not in vars(trainer) and "start" not in vars(trainer.profiler)

    # A second fit in the process goes unrecorded, and says so, rather than fail on the monitor's registry.
    events.clear()
    again = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        callbacks=[TrainstackCallback()],
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    again.fit(example.Regressor(), DataLoader(train, batch_size=batch))
    assert [event for event in events if event[0] not in ("fetch",)] == []
    assert "trainstack: one fit per process is recorded; this fit is not" in capsys.readouterr().err

    # A fit resumed from the checkpoint at step 4 (in a process of its own, as a resumed run is) numbers on from it.
    events.clear()
    monkeypatch.setattr(lightning_hooks, "_process", {"recorded": False})
    resumed = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        callbacks=[TrainstackCallback()],
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    resumed.fit(example.Regressor(), DataLoader(train, batch_size=batch), ckpt_path=tmp_path / "epoch=0-step=4.ckpt")
    assert [event[:3] for event in events if event[0] == "resumed_at"] == [("resumed_at", 4, 0)]
    assert [event[0] for event in events].count("step") == steps - 4


def test_a_pytorch_lightning_trainer_gets_the_same_callback_made_from_its_own_package(tmp_path, monkeypatch):
    """The standalone `pytorch_lightning` package is Lightning's code under another name: its Trainer accepts only
    its own package's Callback, so trainstack makes the same hooks into one of each."""
    import pytorch_lightning

    from trainstack.integrations.pytorch_lightning import TrainstackCallback as PytorchLightningCallback

    class Regressor(pytorch_lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def forward(self, inputs):
            return self.layer(inputs)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return torch.nn.functional.mse_loss(self(inputs), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    events: list[tuple] = []
    monkeypatch.setattr(tsm, "start", lambda model, **options: Recorder(events))
    monkeypatch.setattr(lightning_hooks, "_process", {"recorded": False})
    trainer = pytorch_lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        callbacks=[PytorchLightningCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        default_root_dir=tmp_path,
    )
    samples = torch.utils.data.TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
    trainer.fit(Regressor(), DataLoader(Noted("fetch", samples, events), batch_size=4))
    places, stepped = where_things_happen(events)
    assert places[("fetch", "data wait")] == 12 and places[("forward_started", None)] == 3
    assert [(call[0], call[1] if call[0] == "step" else None) for call in stepped] == [("step", 4)] * 3 + [
        ("close", None)
    ]


def test_a_strategy_holding_ddps_one_comm_hook_is_recorded_all_the_same(monkeypatch, capsys):
    """The monitor times DDP's all-reduce without a hook of its own: the strategy's hook stays, and the fit is
    recorded."""
    started = []
    monkeypatch.setattr(tsm, "start", lambda model, **options: started.append(model) or tsm.NullMonitor())
    monkeypatch.setattr(lightning_hooks, "_process", {"recorded": False})
    profiler = SimpleNamespace(start=lambda action: None, stop=lambda action: None)
    strategy = SimpleNamespace(model=torch.nn.Linear(2, 2), _ddp_comm_hook=lambda state, bucket: None)
    trainer = SimpleNamespace(strategy=strategy, optimizers=[], profiler=profiler, save_checkpoint=lambda path: None)
    callback = TrainstackCallback()
    callback.on_fit_start(trainer, None)
    callback.on_fit_end(trainer, None)
    assert started == [strategy.model]
    assert capsys.readouterr().err == ""


def test_a_training_forward_is_timed_from_before_the_monitors_own_pre_hooks(monkeypatch):
    """The waits the monitor's pre-hooks mark (DDP's buffer broadcast, FSDP's all-gathers) are inside the forward:
    timed from after them, a peer's wait there read as its own forward work (a peer slowed in its loader doubled
    the forward of the rank that waited for it, in the watched matrix)."""
    events: list[tuple] = []
    model = torch.nn.Linear(2, 2)

    def start(model, **options):
        model.register_forward_pre_hook(lambda module, args: events.append(("timing's pre-hook", {})))
        return Recorder(events)

    monkeypatch.setattr(tsm, "start", start)
    monkeypatch.setattr(lightning_hooks, "_process", {"recorded": False})
    profiler = SimpleNamespace(start=lambda action: None, stop=lambda action: None)
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(model=model),
        optimizers=[],
        profiler=profiler,
        save_checkpoint=lambda path: None,
        training=True,
    )
    callback = TrainstackCallback()
    callback.on_fit_start(trainer, None)
    model(torch.ones(1, 2))
    callback.on_fit_end(trainer, None)
    assert [event[0] for event in events] == ["forward_started", "timing's pre-hook", "forward_done", "close"]
