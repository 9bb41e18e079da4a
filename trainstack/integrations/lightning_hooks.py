"""What trainstack's Lightning callback does, whichever package the Trainer comes from: `lightning.pytorch`
(trainstack/integrations/lightning.py) or the standalone `pytorch_lightning` (trainstack/integrations/
pytorch_lightning.py), the same code under two names whose Trainers each accept only their own package's
`Callback`. This module imports neither; each of those two makes the callback from `LightningHooks` and its
package's `Callback`. docs/lightning-callback.md shows it in use and says what each figure brackets.

Lightning 2.6's training loop, one micro-batch at a time (`_TrainingEpochLoop.advance`):

    broadcast of the stop flag        (world size above 1: a fast rank waits here for a slow one)
    fetch of the next batch           (inside the profiler action `[_TrainingEpochLoop].train_dataloader_next`)
    on_train_batch_start
    training_step through the strategy's model (DDP/FSDP wrapper: its forward hooks), backward,
    on_before_optimizer_step and the optimizer step (only on a micro-batch that ends an accumulation)
    on_train_batch_end                (ModelCheckpoint, ordered last among callbacks, may save here)
    validation, if due                (on_validation_start .. on_validation_end; it may save at its end)

No callback hook comes before the fetch, so the wait for a batch is timed by the trainer's profiler calls for that
action, and only them: the stop-flag broadcast before it is a wait at a collective, not for input, and stays out of
the data wait: the monitor books it as a wait at the collectives (trainstack/telemetry/collectives.py), as it
books every collective Lightning or the module calls. An evaluation's fetches are other actions (its loop is paused).
Saves go through the public `Trainer.save_checkpoint` (ModelCheckpoint's and a user's own): each is a checkpoint
pause, its barrier included. The callback wraps the trainer's profiler and `save_checkpoint` on the instance for
the fit, and puts them back when the fit ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

import trainstack.monitor as tsm
from trainstack.breakdown import CHECKPOINT_SAVE, EVALUATION

if TYPE_CHECKING:
    import lightning.pytorch as pl

# What the trainer does outside a training step's own work, as the callback times it (None: a step, or no fit).
BATCH = "batch"  # waits for the next training batch: the monitor's data wait
PAUSES = (EVALUATION, CHECKPOINT_SAVE)  # the monitor's pauses the callback times
FETCH_ACTION = "].train_dataloader_next"  # how the training epoch loop names its fetch to the profiler
_process = {"recorded": False}  # a fit of this process has started a Monitor (not a NullMonitor)


class LightningHooks:  # no Lightning base class: each package's TrainstackCallback adds its own Callback
    """Per-rank steps, samples, tokens, data wait, forward time, gradient communication, memory, loss and learning
    rate of a Lightning fit, recorded by trainstack.monitor: under `trainstack watch` each rank shows on the
    exporter, in diagnose and in the report; elsewhere it records nothing and says so once.

    options: trainstack.monitor.start's other keyword arguments: `flops_per_token` for MFU, `log_every`,
        `dataset`, `model_name`, ...
    """

    batch_size_of: Callable[[Any], int]
    """Lightning's own reading of a batch's size (`utilities.data.extract_batch_size`), from the callback's package."""

    def __init__(self, **options) -> None:
        self._options = options
        self._monitor: tsm.TrainingMonitor | None = None  # a Monitor from on_fit_start to the fit's end
        self._trainer: pl.Trainer | None = None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._wrapped: list[tuple[object, str, bool, object]] = []  # (object, attribute, was set on it, old value)
        self._between: str | None = None
        self._samples = 0
        self._tokens: int | torch.Tensor = 0
        self._stepped = False  # the optimizer stepped on this micro-batch
        self._epoch = 0

    # ---- the fit's hooks --------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The first hook where the strategy has wrapped the model (DDP, FSDP) and made the optimizers.
        model = trainer.strategy.model
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._trainer = trainer
        if _process["recorded"]:
            # A rank's series are registered once per process: a second fit (another Trainer, a fit after a
            # fit) would fail the run in the monitor's start, so it goes unrecorded, and says so.
            print("trainstack: one fit per process is recorded; this fit is not", file=sys.stderr)
            self._monitor = tsm.NullMonitor()
        else:
            self._monitor = tsm.start(model, optimizer=optimizer, **self._options)
            _process["recorded"] = isinstance(self._monitor, tsm.Monitor)
        # First among the model's pre-hooks, as the monitor's DDP and FSDP timing registered theirs in start: the
        # waits they mark (DDP's buffer broadcast, FSDP's all-gathers) are then inside the forward, not its work.
        self._hooks = [
            model.register_forward_pre_hook(self._forward_starts, prepend=True),
            model.register_forward_hook(self._forward_ends),
        ]
        self._wrap(trainer.profiler, "start", self._profiler_start)
        self._wrap(trainer.profiler, "stop", self._profiler_stop)
        self._wrap(trainer, "save_checkpoint", self._saving)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step:  # resumed from a checkpoint: restored after on_fit_start
            self._active.resumed_at(trainer.global_step, trainer.current_epoch)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch = trainer.current_epoch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        self._switch(None)  # a fetch that raised leaves no stop behind it
        samples, tokens = samples_and_tokens(batch, self.batch_size_of)
        self._samples += samples
        self._tokens = tokens
        self._stepped = False

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        self._stepped = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        loss = loss if isinstance(loss, torch.Tensor) else None  # left on the device: no host sync
        if self._stepped:  # the micro-batch that ended an accumulation: an optimizer step of all its samples
            self._active.step(self._samples, tokens=self._tokens, loss=loss, epoch=self._epoch)
            self._samples = 0
        else:
            self._active.micro_batch(tokens=self._tokens, loss=loss)
        self._tokens = 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._monitor is not None:  # within a fit (its sanity check included), not trainer.validate()
            self._switch(EVALUATION)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._monitor is not None:
            self._switch(None)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._finish()  # a fit that raised gets no on_fit_end

    # ---- what the callback wraps ------------------------------------------------------------------------------
    def _profiler_start(self, start: Callable, action_name: str) -> None:
        start(action_name)
        if action_name.endswith(FETCH_ACTION) and self._between is None:
            self._switch(BATCH)

    def _profiler_stop(self, stop: Callable, action_name: str) -> None:
        if action_name.endswith(FETCH_ACTION) and self._between == BATCH:
            self._switch(None)
        stop(action_name)

    def _saving(self, save_checkpoint: Callable, *args, **kwargs) -> Any:
        before = self._between  # a save at the end of a validation splits its pause
        self._switch(CHECKPOINT_SAVE)
        try:
            return save_checkpoint(*args, **kwargs)
        finally:
            self._switch(before)

    def _wrap(self, owner: object, name: str, through: Callable) -> None:
        """Sets `owner.name` to call `through(original, ...)` until the fit ends."""
        had = name in vars(owner)
        original = getattr(owner, name)
        self._wrapped.append((owner, name, had, vars(owner).get(name)))
        setattr(owner, name, lambda *args, **kwargs: through(original, *args, **kwargs))

    def _finish(self) -> None:
        if self._monitor is None:
            return
        self._switch(None)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for owner, name, had, value in reversed(self._wrapped):
            if had:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
        self._wrapped = []
        monitor, self._monitor, self._trainer = self._monitor, None, None
        monitor.close()

    # ---- between steps ----------------------------------------------------------------------------------------
    @property
    def _active(self) -> tsm.TrainingMonitor:
        assert self._monitor is not None, "Lightning calls these between on_fit_start and the fit's end"
        return self._monitor

    def _switch(self, between: str | None) -> None:
        if between == self._between or self._monitor is None:
            return
        if self._between == BATCH:
            self._monitor.data_ready()
        elif self._between in PAUSES:
            self._monitor.pause_ended(self._between)
        if between == BATCH:
            self._monitor.data_wait_started()
        elif between in PAUSES:
            self._monitor.pause_started(between)
        self._between = between

    # ---- the model's hooks ------------------------------------------------------------------------------------
    def _training(self) -> bool:
        """A training step's forward: not validation's (which goes through the same wrapper), nor in a pause."""
        return self._trainer is not None and self._trainer.training and self._between is None

    def _forward_starts(self, module: torch.nn.Module, args: tuple) -> None:
        if self._training():
            self._active.forward_started()

    def _forward_ends(self, module: torch.nn.Module, args: tuple, output) -> None:
        if self._training():
            self._active.forward_done()


def samples_and_tokens(batch, batch_size_of: Callable[[Any], int]) -> tuple[int, int | torch.Tensor]:
    """A training batch's samples (`batch_size_of`, Lightning's own reading: the first dimension of a tensor in it)
    and tokens:
    `attention_mask`'s sum beside `input_ids` (left on the device: no host sync), else every element of the first
    integer tensor (token ids), else none."""
    try:
        samples = batch_size_of(batch)
    except Exception:  # a batch Lightning cannot read either: its size is unknown, not a failure of the run
        samples = 0
    if isinstance(batch, Mapping):
        ids, mask = batch.get("input_ids"), batch.get("attention_mask")
        if isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
            return samples, mask.sum()
    ids = _first_tensor(batch)
    if ids is not None and not ids.is_floating_point() and not ids.is_complex() and ids.dtype != torch.bool:
        return samples, ids.numel()
    return samples, 0


def _first_tensor(batch) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        if isinstance(batch.get("input_ids"), torch.Tensor):
            return batch["input_ids"]
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str) and batch:
        return _first_tensor(batch[0])
    return None
