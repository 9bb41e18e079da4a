"""Rank telemetry for any training loop: the public API, and the one trainstack's own loop uses.

    import trainstack.monitor

    monitor = trainstack.monitor.start(model)            # the DDP/FSDP model; does nothing outside a watched run
    for batch in monitor.batches(loader):                # each wait for a batch, on the GPU's clock
        with monitor.forward():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(samples=len(batch["input_ids"]), loss=loss)
    monitor.close()

Inside an open pause (`with monitor.pause("evaluation"):`) `batches`, `forward`, `step` and `micro_batch` record
nothing: a loop that trains and evaluates through the same functions needs no `if training:` around them.

A run started by `trainstack watch -- COMMAND` (or `trainstack train`) hands its ranks the run directory and the
metrics directory in the environment (trainstack/rundir.py); there `start` returns a `Monitor` that publishes the
same per-rank series as trainstack's own loop (steps, samples, tokens, data wait, forward time, gradient
communication and what backward did not hide, MFU, memory) for the exporter, and appends the rank's records for
the report. Anywhere else it returns a `NullMonitor`, which says so once and records nothing.

What it costs a step: a few host clock reads or CUDA events, and adds on the device for the loss and token sums.
It never waits for the device and never talks to another rank: every `log_every` steps it closes an interval and
reads it one interval later, when the device has long finished it (as trainstack's loop reads its loss).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from trainstack import breakdown
from trainstack.rundir import RUN_DIR_ENV, RUN_ID_ENV
from trainstack.telemetry.core import IntervalCut, Telemetry
from trainstack.telemetry.device import device_of, peak_flops, precision_of, rank_identity, tf32_allowed
from trainstack.telemetry.interval import IntervalSums, PendingTotals, interval_ends
from trainstack.telemetry.state import measure_state_once

__all__ = ["PAUSES", "Monitor", "NullMonitor", "start"]

PAUSES = breakdown.PAUSES
"""What a run does besides training steps, as `pause` names it: its time is a part of the rank's wall time of its
own (trainstack/breakdown.py), kept out of step time."""


def start(
    model: torch.nn.Module | None = None,
    *,
    flops_per_token: float | None = None,
    accelerator=None,
    log_every: int = 10,
    precision: str | None = None,
    run_dir: str | Path | None = None,
    model_name: str | None = None,
    dataset: str = "",
    run_id: str | None = None,
    optimizer=None,
    enabled: bool = True,
    comm_hook: Callable | None = None,
) -> NullMonitor:
    """A Monitor for this rank, or a NullMonitor outside a watched run (or with `enabled=False`).

    model: the model as the loop calls it (after DDP/FSDP wrapping or `accelerator.prepare`); its gradient
      communication is timed. Pass it later with `watch` if it is wrapped after this call.
    flops_per_token: the model's training FLOPs per token (about 6 x its parameters); gives MFU on a known GPU.
    accelerator: an Accelerate `Accelerator`: the device, ranks and mixed precision come from it.
    precision: "bf16", "fp16" or "no" (fp32), for MFU's peak; defaults to the accelerator's or the parameters'.
    run_dir: where the records go; defaults to TRAINSTACK_RUN_DIR, which `trainstack watch` sets.
    run_id: the run's name on its series; defaults to TRAINSTACK_RUN_ID, which `trainstack watch` sets.
    optimizer: its learning rate is recorded, and its state's bytes, with the parameters' and gradients', are
      measured after its first step.
    comm_hook: a DDP communication hook for the model (e.g. torch's `default_hooks.bf16_compress_hook`), given here
      instead of to `register_comm_hook`: DDP takes one hook per model, and the monitor's timing of the all-reduce
      is one; it runs the given hook inside it, and registers it plainly when it records nothing.
    """
    if log_every < 1:
        raise ValueError(f"log_every must be at least 1 step, not {log_every}")
    run_dir = run_dir or os.environ.get(RUN_DIR_ENV)
    if not enabled or not run_dir:
        if enabled:
            _say_once(
                f"trainstack.monitor: not in a watched run ({RUN_DIR_ENV} is unset), so nothing is recorded; "
                "run the script with `trainstack watch -- python ...` to see its ranks"
            )
        idle = NullMonitor()
        if model is not None:
            idle.watch(model, comm_hook)
        return idle
    device = device_of(model, accelerator)
    precision = precision or precision_of(model, accelerator)
    identity = rank_identity(
        model, accelerator, device, precision, model_name, dataset, run_id or os.environ.get(RUN_ID_ENV, "manual")
    )
    telemetry = Telemetry(
        Path(run_dir),
        identity,
        flops_per_token or 0.0,
        peak_flops(device, precision, tf32_allowed()) if flops_per_token else None,
        device,
    )
    monitor = Monitor(telemetry, log_every, optimizer)
    if model is not None:
        monitor.watch(model, comm_hook)
        if optimizer is not None:
            measure_state_once(model, getattr(optimizer, "optimizer", optimizer), telemetry)  # Accelerate wraps it
    return monitor


class NullMonitor:
    """The loop API, recording nothing: outside a watched run (or with `enabled=False`), and the base of `Monitor`,
    which overrides every method with the same parameters (tests/unit/trainstack/test_monitor.py keeps the two
    alike)."""

    steps = 0
    epoch = 0
    data_wait_share: float | None = None

    def watch(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times nothing; a DDP model's `comm_hook` is registered as it is."""
        if comm_hook is not None and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, comm_hook)
        return False

    def batches(self, loader: Iterable) -> Iterator:
        return iter(loader)

    def data_wait_started(self) -> None:
        pass

    def data_ready(self) -> None:
        pass

    @contextmanager
    def forward(self):
        yield

    def forward_started(self) -> None:
        pass

    def forward_done(self) -> None:
        pass

    def micro_batch(self, *, tokens=None, loss=None) -> None:
        pass

    def step(
        self, samples: int, *, tokens=None, loss=None, lr=None, epoch=None, compile_seconds=None, recompiles=0
    ) -> None:
        pass

    def resumed_at(self, step: int, epoch: int = 0) -> None:
        pass

    @contextmanager
    def pause(self, part: str):
        yield

    def pause_started(self, part: str) -> None:
        pass

    def pause_ended(self, part: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Monitor(NullMonitor):
    """One rank's telemetry. Its methods may be called as the loop reaches each point; the context managers and
    `batches` are the same calls placed for you."""

    def __init__(self, telemetry: Telemetry, log_every: int, optimizer=None):
        self.telemetry = telemetry
        self.log_every = log_every
        self.steps = 0
        self.epoch = 0
        self.data_wait_share: float | None = None
        """The last recorded interval's data-wait share of step time (trainstack/ratios.py DATA_WAIT_SHARE)."""
        self._sums = IntervalSums()
        self._open: tuple[IntervalCut, PendingTotals, int, int, float | None] | None = None
        self._optimizer = optimizer  # its learning rate is the record's, unless `step` is given one
        self._lr: float | None = None
        self._paused = False
        """A pause is open: the loop evaluates or checkpoints, so its batches, forwards and steps train nothing."""

    # ---- the loop's points ------------------------------------------------------------------------------------
    def watch(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times the model's gradient communication (DDP, FSDP); False for a model without any. comm_hook: a DDP
        communication hook run inside the timing (start's `comm_hook`)."""
        return self.telemetry.watch_communication(model, comm_hook)

    def batches(self, loader: Iterable) -> Iterator:
        """The loader's batches, each wait for one timed (not inside a pause: an evaluation's loader is no
        training's wait)."""
        batches = iter(loader)
        while True:
            self.data_wait_started()
            try:
                batch = next(batches)
            except StopIteration:
                self.data_ready()
                return
            self.data_ready()
            yield batch

    def data_wait_started(self) -> None:
        if not self._paused:
            self.telemetry.data_wait_started()

    def data_ready(self) -> None:
        if not self._paused:
            self.telemetry.data_ready()

    @contextmanager
    def forward(self):
        self.forward_started()
        yield
        self.forward_done()

    def forward_started(self) -> None:
        if not self._paused:
            self.telemetry.forward_started()

    def forward_done(self) -> None:
        if not self._paused:
            self.telemetry.forward_done()

    def micro_batch(
        self, *, tokens: int | torch.Tensor | None = None, loss: float | torch.Tensor | None = None
    ) -> None:
        """A micro-batch of gradient accumulation that did not step the optimizer: its tokens and loss."""
        if not self._paused:
            self._sums.add(loss, tokens)

    def step(
        self,
        samples: int,
        *,
        tokens: int | torch.Tensor | None = None,
        loss: float | torch.Tensor | None = None,
        lr: float | None = None,
        epoch: int | None = None,
        compile_seconds: float | None = None,
        recompiles: int = 0,
    ) -> None:
        """An optimizer step: the samples it trained on (all micro-batches); its last micro-batch's tokens and loss
        (device tensors are summed on the device, never read here). `compile_seconds`: the step compiled, and
        that long is compile time, not step time. Inside a pause (an evaluation's batches) it records nothing."""
        if self._paused:
            return
        self._sums.add(loss, tokens)
        if compile_seconds is None:
            self.telemetry.step_done(samples)
        else:
            self.telemetry.step_compiled(samples, compile_seconds, recompiles)
        self.steps += 1
        if lr is not None:
            self._lr = lr
        elif self._optimizer is not None:
            self._lr = self._optimizer.param_groups[0]["lr"]
        self.epoch = self.epoch if epoch is None else epoch
        if interval_ends(self.steps, self.log_every):
            self._record_open()  # queued steps behind it: the device has run the open interval by now
            self._open_interval()

    def resumed_at(self, step: int, epoch: int = 0) -> None:
        """The run continues from a checkpoint: steps are numbered on from `step`."""
        self.steps, self.epoch = step, epoch

    @contextmanager
    def pause(self, part: str):
        """Time that trains nothing (evaluation, a checkpoint): not counted as a step; the monitor's calls
        inside it record nothing."""
        self.pause_started(part)
        try:
            yield
        finally:
            self.pause_ended(part)

    def pause_started(self, part: str) -> None:
        """`part`: one of PAUSES. On a GPU the pause begins once the device has run the steps queued before it."""
        self.telemetry.pause_started(part)
        self._paused = True

    def pause_ended(self, part: str) -> None:
        seconds = self.telemetry.pause_ended(part)
        self._paused = False
        if part == breakdown.CHECKPOINT_SAVE:
            self.telemetry.checkpoint_done(seconds)

    def flush(self) -> None:
        """Records everything up to now, waiting for the device: before a checkpoint or at the end."""
        self._record_open()
        if self._sums.micro_batches:
            self._open_interval()
            self._record_open()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.telemetry.close()

    # ---- intervals --------------------------------------------------------------------------------------------
    def _open_interval(self) -> None:
        self._open = (self.telemetry.interval_ended(), self._sums.take(), self.steps, self.epoch, self._lr)

    def _record_open(self) -> None:
        if self._open is None:
            return
        cut, sums, step, epoch, lr = self._open
        self._open = None
        totals = sums.result()
        self.data_wait_share = self.telemetry.interval_done(cut, step, epoch, totals.loss, lr, totals.local_tokens)


# ---- saying so --------------------------------------------------------------------------------------------
def _say_once(message: str, _said: set[str] = set()) -> None:  # noqa: B006 (the set is the memory)
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr)
