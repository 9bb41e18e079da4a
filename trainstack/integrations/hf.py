"""`TrainstackCallback`: trainstack's per-rank telemetry (trainstack.monitor) for a transformers `Trainer` run, from
its callback events. docs/hf-callback.md shows it in use and says what each figure brackets.

    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate)
    trainer.add_callback(TrainstackCallback(trainer))
    trainer.train()

Since 4.46 the Trainer fetches all of an optimizer step's micro-batches (`get_batch_samples`) before
`on_step_begin`, and between `on_step_end` and that fetch it may log (`on_log` when done), evaluate (`on_evaluate`)
and save a checkpoint (`on_save`), in that order. Which of them will run is in the control flags: the
DefaultFlowCallback, which runs before any callback added to the Trainer, sets them at `on_step_end` and
`on_epoch_end`, and the Trainer clears each one just before the event that ends its work. So at each of those events
the flags still set name what comes next, and the callback starts timing it there: the wait for the next batch ends
at `on_step_begin`, a pause at its own event. Forward time and each micro-batch's samples and tokens come from hooks
on the outermost model (`trainer.model_wrapped`: DDP, FSDP or DataParallel around the model), which only the
training steps call in training mode.
"""

from __future__ import annotations

try:
    from transformers import TrainerCallback
except ModuleNotFoundError as missing:
    if missing.name != "transformers":
        raise  # transformers is there but broken: its own error says why
    raise ImportError("trainstack.integrations.hf needs transformers: pip install trainstack[hf]") from None

import os
import sys

import torch

import trainstack.monitor as tsm
from trainstack.breakdown import CHECKPOINT_SAVE, EVALUATION

# What the Trainer does between two steps, as the callback times it (None: a step, or no training).
BATCH = "batch"  # waits for the next batch: the monitor's data wait
LOG = "log"  # reduces the loss across ranks and logs it: the Trainer's own work, part of the step's time
PAUSES = (EVALUATION, CHECKPOINT_SAVE)  # the monitor's pauses the callback times


class TrainstackCallback(TrainerCallback):
    """Per-rank steps, samples, tokens, data wait, forward time, gradient communication, memory, loss and learning
    rate of a Trainer run, recorded by trainstack.monitor: under `trainstack watch` each rank shows on the exporter,
    in diagnose and in the report; elsewhere it records nothing and says so once.

    trainer: the Trainer it is added to; its wrapped model and its optimizer, once `train()` has made them, are
        what the monitor watches.
    options: trainstack.monitor.start's other keyword arguments: `flops_per_token` for MFU (the Trainer's own
        estimate is `6 * model.num_parameters(exclude_embeddings=True)`), `log_every`, `dataset`, ...
    """

    def __init__(self, trainer, **options):
        self._trainer = trainer
        self._options = options
        self._monitor: tsm.TrainingMonitor | None = None  # from on_train_begin to on_train_end
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._between: str | None = None
        self._main_input = "input_ids"
        self._batch_size = 0
        self._samples = 0
        self._tokens: int | torch.Tensor = 0
        self._logged_loss: float | None = None
        self._epoch = 0

    # ---- the Trainer's events ---------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > args.world_size:  # Accelerate's silent fallback: it still exits 0, having trained N times
            print(
                f"trainstack: {launched} processes were launched but the Trainer is not distributed, so each trains "
                "alone; without GPUs, set TrainingArguments(use_cpu=True) or ACCELERATE_USE_CPU=1",
                file=sys.stderr,
            )
        trainer = self._trainer
        model = trainer.model_wrapped
        # A train() that restarts its loop (auto_find_batch_size) begins again on the monitor it started.
        if self._monitor is None:
            self._monitor = tsm.start(
                model, accelerator=trainer.accelerator, optimizer=trainer.optimizer, **self._options
            )
            if state.global_step:  # resumed from a checkpoint
                self._monitor.resumed_at(state.global_step, int(state.epoch))
        self._remove_hooks()
        # First among the model's pre-hooks, as the monitor's DDP and FSDP timing registered theirs in start: the
        # waits they mark (DDP's buffer broadcast, FSDP's all-gathers) are then inside the forward, not its work.
        self._hooks = [
            model.register_forward_pre_hook(self._forward_starts, prepend=True, with_kwargs=True),
            model.register_forward_hook(self._forward_ends),
        ]
        self._main_input = getattr(trainer.model, "main_input_name", "input_ids")
        self._batch_size = args.train_batch_size  # per process; DataParallel's covers all its GPUs
        if args.eval_on_start:
            self._switch(EVALUATION)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch = int(state.epoch)  # whole at an epoch's start: the epochs done
        self._switch(BATCH)  # the epoch's loader iterator is made, then its first batches fetched

    def on_step_begin(self, args, state, control, **kwargs):
        self._switch(None)

    def on_step_end(self, args, state, control, **kwargs):
        self._monitor.step(self._samples, tokens=self._tokens, loss=self._logged_loss, epoch=self._epoch)
        self._samples, self._tokens, self._logged_loss = 0, 0, None
        self._next(args, control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The training loss as the Trainer logs it, averaged over the ranks and the steps since its last log; it
        # goes with the next step (the step's own loss never reaches a callback).
        if logs and "loss" in logs:
            self._logged_loss = logs["loss"]
        if self._between == LOG:  # not an evaluation's metrics, nor the summary at the end of training
            self._next(args, control)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._between == EVALUATION:
            self._next(args, control, after_evaluation=True)

    def on_save(self, args, state, control, **kwargs):
        if self._between == CHECKPOINT_SAVE:
            self._next(args, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._next(args, control)

    def on_train_end(self, args, state, control, **kwargs):
        self._switch(None)
        self._remove_hooks()
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

    # ---- between steps ----------------------------------------------------------------------------------------
    def _next(self, args, control, after_evaluation: bool = False) -> None:
        """Times what the Trainer does next, as its control flags say (the module's docstring says why they can)."""
        if control.should_log:
            self._switch(LOG)
        elif control.should_evaluate:
            self._switch(EVALUATION)
        # save_strategy "best" decides to save only after on_evaluate: a save may follow any evaluation.
        elif control.should_save or (after_evaluation and args.save_strategy == "best"):
            self._switch(CHECKPOINT_SAVE)
        elif control.should_training_stop:
            self._switch(None)  # no batch is fetched after the last step
        else:
            self._switch(BATCH)

    @property
    def _active(self) -> tsm.TrainingMonitor:
        """The monitor, which the Trainer's events and the model's hooks reach only while it trains."""
        assert self._monitor is not None, "the Trainer calls these between on_train_begin and on_train_end"
        return self._monitor

    def _switch(self, between: str | None) -> None:
        if between == self._between:
            return
        if self._between == BATCH:
            self._active.data_ready()
        elif self._between in PAUSES:
            self._active.pause_ended(self._between)
        if between == BATCH:
            self._active.data_wait_started()
        elif between in PAUSES:
            self._active.pause_started(between)
        self._between = between

    # ---- the model's hooks ------------------------------------------------------------------------------------
    def _forward_starts(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not module.training:  # an evaluation's forward (with no wrapper, the model itself is hooked)
            return
        batch = kwargs.get(self._main_input, args[0] if args else None)
        if isinstance(batch, torch.Tensor):
            self._samples += batch.shape[0]
            mask = kwargs.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.shape == batch.shape:
                self._tokens = self._tokens + mask.sum()  # non-padding tokens, left on the device: no host sync
            elif not batch.is_floating_point():  # token ids without a mask: every one counts
                self._tokens += batch.numel()
        else:
            self._samples += self._batch_size  # an input the hook cannot read: the configured batch size
        self._active.forward_started()

    def _forward_ends(self, module: torch.nn.Module, args: tuple, output) -> None:
        if module.training:
            self._active.forward_done()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
