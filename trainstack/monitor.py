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
the report. Anywhere else it returns a `NullMonitor`, which says so once and records nothing. Both are a
`TrainingMonitor`, the type a loop holds either by.

What it costs a step: a few host clock reads or CUDA events, and adds on the device for the loss and token sums.
It never waits for the device and never talks to another rank: every `log_every` steps it closes an interval and
reads it one interval later, when the device has long finished it (as trainstack's loop reads its loss).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainstack import breakdown, ratios
from trainstack.hang import publish_progress_each_poll, start_responder
from trainstack.record import IntervalRecord, SegmentEnded, pauses
from trainstack.rundir import DEFAULT_LOG_EVERY, LOG_EVERY_ENV, METRICS_DIR_ENV, RUN_DIR_ENV, RUN_ID_ENV, RunDir
from trainstack.telemetry.clock import RankClock, clock_for
from trainstack.telemetry.collectives import CollectiveBooking, watch_collectives
from trainstack.telemetry.comm import watch_gradient_communication
from trainstack.telemetry.comm_setup import CommSetup
from trainstack.telemetry.comm_timer import Collective, CommTimer, StepComm
from trainstack.telemetry.device import (
    RankIdentity,
    device_of,
    peak_flops,
    precision_of,
    rank_identity,
    tf32_allowed,
)
from trainstack.telemetry.future_callbacks import FutureCallbacks, on_gloo, settle_gloo_threads
from trainstack.telemetry.interval import IntervalCut, IntervalSums, PendingTotals, interval_ends
from trainstack.telemetry.metrics import CommMetrics, RankMetrics
from trainstack.telemetry.records_file import launch_time, open_records
from trainstack.telemetry.state import measure_state_once
from trainstack.telemetry.wall_time import WallTime
from trainstack.write_failure import write_failure

__all__ = ["PAUSES", "Monitor", "NullMonitor", "TrainingMonitor", "start"]

PAUSES = breakdown.PAUSES
"""What a run does besides training steps, as `pause` names it: its time is a part of the rank's wall time of its
own (trainstack/breakdown.py), kept out of step time."""
PUBLISH_SECONDS = 1.0
"""The most a held series (telemetry/metrics.py) lags the rank's steps: well inside a scrape interval."""


class TrainingMonitor(Protocol):
    """The loop API. Its methods may be called as the loop reaches each point; the context managers and `batches`
    are the same calls placed for you."""

    steps: int
    """Optimizer steps so far (numbered on from a resumed checkpoint's)."""
    epoch: int
    data_wait_share: float | None
    """The last recorded interval's data-wait share of step time (trainstack/ratios.py DATA_WAIT_SHARE)."""

    def watch(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times the model's gradient communication (DDP, FSDP); False for a model without any. comm_hook: a DDP
        communication hook to register on the model (start's `comm_hook`)."""
        ...

    def batches(self, loader: Iterable) -> Iterator:
        """The loader's batches, each wait for one timed (not inside a pause: an evaluation's loader is no
        training's wait)."""
        ...

    def data_wait_started(self) -> None:
        """The loop is about to ask the loader for the next batch."""
        ...

    def data_ready(self) -> None:
        """The loader answered (a batch, now on the device, or the end of the epoch)."""
        ...

    def forward(self) -> AbstractContextManager[None]:
        """`forward_started` and `forward_done` around the block."""
        ...

    def forward_started(self) -> None:
        """Forward time says which part of a straggler's step is slow. The waits for collectives inside it (DDP's
        buffer broadcast, FSDP's all-gathers) are communication, taken out when the interval is read."""
        ...

    def forward_done(self) -> None: ...

    def micro_batch(
        self, *, tokens: int | torch.Tensor | None = None, loss: float | torch.Tensor | None = None
    ) -> None:
        """A micro-batch of gradient accumulation that did not step the optimizer: its tokens and loss."""
        ...

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
        ...

    def resumed_at(self, step: int, epoch: int = 0) -> None:
        """The run continues from a checkpoint: steps are numbered on from `step`."""
        ...

    def pause(self, part: str) -> AbstractContextManager[None]:
        """Time that trains nothing (evaluation, a checkpoint): not counted as a step; the monitor's calls
        inside it record nothing."""
        ...

    def pause_started(self, part: str) -> None:
        """`part`: one of PAUSES. On a GPU the pause begins once the device has run the steps queued before it."""
        ...

    def pause_ended(self, part: str) -> None: ...

    def flush(self) -> None:
        """Records everything up to now, waiting for the device: before a checkpoint or at the end."""
        ...

    def close(self) -> None: ...


def start(
    model: torch.nn.Module | None = None,
    *,
    flops_per_token: float | None = None,
    accelerator=None,
    log_every: int | None = None,
    precision: str | None = None,
    run_dir: str | Path | None = None,
    model_name: str | None = None,
    dataset: str = "",
    run_id: str | None = None,
    optimizer=None,
    enabled: bool = True,
    comm_hook: Callable | None = None,
    interval_totals: Callable[[IntervalSums], PendingTotals] | None = None,
) -> TrainingMonitor:
    """A Monitor for this rank, or a NullMonitor outside a watched run (or with `enabled=False`).

    model: the model as the loop calls it (after DDP/FSDP wrapping or `accelerator.prepare`); its gradient
      communication is timed. Pass it later with `watch` if it is wrapped after this call.
    flops_per_token: the model's training FLOPs per token (about 6 x its parameters); gives MFU on a known GPU.
    accelerator: an Accelerate `Accelerator`: the device, ranks and mixed precision come from it.
    log_every: optimizer steps per interval, each a record of this rank; defaults to TRAINSTACK_LOG_EVERY, which
      `trainstack watch --log-every` sets, else 10.
    precision: "bf16", "fp16" or "no" (fp32), for MFU's peak; defaults to the accelerator's or the parameters'.
    run_dir: where the records go; defaults to TRAINSTACK_RUN_DIR, which `trainstack watch` sets.
    run_id: the run's name on its series; defaults to TRAINSTACK_RUN_ID, which `trainstack watch` sets.
    optimizer: its learning rate is recorded, and its state's bytes, with the parameters' and gradients', are
      measured after its first step.
    comm_hook: a DDP communication hook for the model (e.g. torch's `default_hooks.bf16_compress_hook`), registered
      on it; the same as the loop's own `register_comm_hook`, which the monitor's timing leaves free.
    interval_totals: for a loop that reads the monitor's loss and token sums: called with them at each interval's
      end (and at `flush`), it closes them (`IntervalSums.take` or `start_reduce`, trainstack/telemetry/interval.py)
      and keeps what it returns to read later; the records show this rank's own. A NullMonitor given it keeps the
      sums too. trainstack's Trainer reduces them across its ranks here, the one collective of its loop.
    """
    log_every = interval_steps() if log_every is None else log_every
    if log_every < 1:
        raise ValueError(f"log_every must be at least 1 step, not {log_every}")
    run_dir = run_dir or os.environ.get(RUN_DIR_ENV)
    if not enabled or not run_dir:
        if enabled:
            _say_once(
                f"trainstack.monitor: not in a watched run ({RUN_DIR_ENV} is unset), so nothing is recorded; "
                "run the script with `trainstack watch -- python ...` to see its ranks"
            )
        idle = NullMonitor(log_every, interval_totals)
        if model is not None:
            idle.watch(model, comm_hook)
        return idle
    device = device_of(model, accelerator)
    precision = precision or precision_of(model, accelerator)
    identity = rank_identity(
        model, accelerator, device, precision, model_name, dataset, run_id or os.environ.get(RUN_ID_ENV, "manual")
    )
    monitor = Monitor(
        Path(run_dir),
        identity,
        flops_per_token or 0.0,
        peak_flops(device, precision, tf32_allowed()) if flops_per_token else None,
        device,
        log_every=log_every,
        optimizer=optimizer,
        interval_totals=interval_totals,
    )
    if model is not None:
        monitor.watch(model, comm_hook)
        if optimizer is not None:  # Accelerate wraps it
            measure_state_once(model, getattr(optimizer, "optimizer", optimizer), monitor._state_measured)
    return monitor


def interval_steps() -> int:
    """The steps per interval `trainstack watch --log-every` gave its ranks (LOG_EVERY_ENV), else the default."""
    given = os.environ.get(LOG_EVERY_ENV, "")
    if not given:
        return DEFAULT_LOG_EVERY
    try:
        return int(given)
    except ValueError:
        raise ValueError(
            f"{LOG_EVERY_ENV}={given!r} is not a number of steps; unset it or give a whole number"
        ) from None


def _register_comm_hook(model: torch.nn.Module, comm_hook: Callable | None) -> None:
    if comm_hook is not None and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(None, comm_hook)


class NullMonitor(TrainingMonitor):
    """The loop API, recording nothing: outside a watched run (or with `enabled=False`). Given `interval_totals`
    (start's), it still sums the loop's loss and tokens and closes them at each interval's end, for the loop to read;
    without, it sums nothing."""

    epoch = 0
    data_wait_share: float | None = None

    def __init__(self, log_every: int = 10, interval_totals: Callable[[IntervalSums], PendingTotals] | None = None):
        self.steps = 0
        self._log_every = log_every
        self._sums = IntervalSums()
        self._close_sums = interval_totals

    def watch(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times nothing; a DDP model's `comm_hook` is registered."""
        _register_comm_hook(model, comm_hook)
        return False

    def batches(self, loader: Iterable) -> Iterator:
        return iter(loader)

    def data_wait_started(self) -> None:
        pass

    def data_ready(self) -> None:
        pass

    @contextmanager
    def forward(self) -> Iterator[None]:
        yield

    def forward_started(self) -> None:
        pass

    def forward_done(self) -> None:
        pass

    def micro_batch(
        self, *, tokens: int | torch.Tensor | None = None, loss: float | torch.Tensor | None = None
    ) -> None:
        if self._close_sums is not None:
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
        self.steps += 1
        if self._close_sums is not None:
            self._sums.add(loss, tokens)
            if interval_ends(self.steps, self._log_every):
                self._close_sums(self._sums)

    def resumed_at(self, step: int, epoch: int = 0) -> None:
        self.steps, self.epoch = step, epoch

    @contextmanager
    def pause(self, part: str) -> Iterator[None]:
        yield

    def pause_started(self, part: str) -> None:
        pass

    def pause_ended(self, part: str) -> None:
        pass

    def flush(self) -> None:
        if self._close_sums is not None and self._sums.micro_batches:
            self._close_sums(self._sums)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class OpenPause:
    part: str
    started: float  # perf_counter()
    started_at: float  # unix time


class Monitor(TrainingMonitor):
    """One rank's telemetry, interval by interval: prometheus_client multiprocess files for the exporter, JSON lines
    for the run report. Its times are measured on one clock, chosen from the device once (trainstack/telemetry/
    clock.py): the host's, or the GPU's CUDA events.

    Nothing here talks to another rank or waits on one: each rank writes its own memory-mapped files (a few
    microseconds per step) and appends one JSON line per log interval. The loss it publishes is the rank's own
    (summed on the device, trainstack/telemetry/interval.py): ranks whose losses part for long train on different
    data.

    It also says where the rank's wall time goes (trainstack/breakdown.py): each interval's step time split into its
    parts, the pauses, the startup from the launch to the first step, and, as the rank exits, a closing line whose
    time ends the rank's wall time.
    """

    def __init__(
        self,
        run_dir: Path,
        identity: RankIdentity,
        flops_per_token: float,
        peak: float | None,
        device: torch.device,
        *,
        log_every: int = 10,
        optimizer=None,
        interval_totals: Callable[[IntervalSums], PendingTotals] | None = None,
    ):
        """`peak`: the device's peak FLOP/s, None where unknown (no MFU); `optimizer`: its learning rate is the
        records', unless `step` is given one; `interval_totals`: start's."""
        self.log_every = log_every
        self.steps = 0
        self.epoch = 0
        self.data_wait_share: float | None = None
        self._sums = IntervalSums()
        self._close_sums = interval_totals or IntervalSums.take
        self._open: tuple[IntervalCut, PendingTotals, int, int, float | None] | None = None
        self._optimizer = optimizer
        self._lr: float | None = None
        self._pause: OpenPause | None = None
        """The open pause: the loop evaluates or checkpoints, so its batches, forwards and steps train nothing."""
        self.rank = str(identity.rank)
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.device = device
        # What measures the step, forward and data-wait times; it starts with the first step's clock, below
        clock = clock_for(device)
        self.clock = clock.name
        self._comm_metrics = CommMetrics.off()  # until a watched model communicates
        self._comm_watched = False
        self._on_gloo = on_gloo()
        """The rank's group ran gloo when last seen: its close settles gloo's threads (future_callbacks.py), even
        once the group is destroyed."""
        self._identity = identity
        self._metrics = (
            RankMetrics.build(identity, self.clock, device.type == "cuda", bool(peak))
            if os.environ.get(METRICS_DIR_ENV)
            else RankMetrics.off()
        )  # no metrics directory: no series
        launched_at = launch_time()
        start_responder(identity.rank)  # hang evidence on the launcher's request (trainstack/hang.py)
        self._records_path = RunDir(run_dir).rank_records(identity.rank)
        with self._storage_failures():
            self._records_path.parent.mkdir(parents=True, exist_ok=True)
            self._records = open_records(self._records_path, identity, launched_at)
        self._stop_publishing_progress = publish_progress_each_poll(self._metrics.publish_progress)
        self._interval_start = self._publish_at = time.time()
        self._rank_clock: RankClock = clock.start(identity.uuid, self._metrics)
        self._clock_started_at = self._interval_start  # unix time the step clock last (re)started
        self._comm: CommTimer = CommTimer(self._rank_clock.marks, in_forward=lambda: self._in_forward)
        self._comm_callbacks = FutureCallbacks()
        self._host_data_wait = 0.0
        self._wait_start = 0.0
        self._samples = 0
        self._in_forward = False
        self._waiting_for_data = False
        self._closing_interval = False
        self._forward_passes = 0
        self._state_bytes: dict[str, int] = {}
        self._wall_time = WallTime(launched_at, self._spent)  # this interval's pauses, compiling steps, startup
        # Every part this rank measures is a series from the start: a rate needs two samples
        for part in filter(self._measures, breakdown.LIVE_PARTS):
            self._metrics.time_of(part)
        # Every collective the loop calls is a wait at the collectives (trainstack/telemetry/collectives.py)
        self._unwatch_collectives = watch_collectives(
            CollectiveBooking(self._collective_started, self._collective_ended)
        )

    # ---- the loop's points ------------------------------------------------------------------------------------
    def watch(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times the communication of a DDP or FSDP model (trainstack/telemetry/comm.py), after registering a DDP
        model's `comm_hook` where given; False for any other."""
        _register_comm_hook(model, comm_hook)
        watched = watch_gradient_communication(
            model, self._comm, self._comm_callbacks, training=lambda: self._pause is None
        )
        if watched:
            self._communicates()
        return watched

    def _communicates(self) -> None:
        """The rank's communication is timed from now on: a watched model's, or the first collective it calls."""
        if self._comm_watched:
            return
        self._comm_watched = True
        self._on_gloo = self._on_gloo or on_gloo()  # a loop may start its monitor before its group
        if os.environ.get(METRICS_DIR_ENV):
            self._comm_metrics = CommMetrics.build(self._identity)
            CommSetup.read().publish(self.rank)  # what diagnose's comm-bound evidence names
        self._metrics.time_of(breakdown.COMM_EXPOSED)

    def _collective_started(self, nbytes: int) -> tuple[Collective, bool] | None:
        """A collective the loop calls itself blocks the rank (trainstack/telemetry/collectives.py): booked as a
        wait at the collectives, never as a wait for data. One inside the wait for a batch (the Hugging Face
        Trainer gathers each rank's label count while it fetches one) ends the data wait before it and starts
        another after it. Inside a pause (evaluation's reductions) nothing trains, so nothing is booked; nor is the
        reduction of the interval's totals."""
        if self._pause is not None or self._closing_interval:
            return None
        in_data_wait = self._waiting_for_data
        if in_data_wait:
            self.data_ready()
        self._communicates()
        return self._comm.launched(nbytes, blocking=True), in_data_wait

    def _collective_ended(self, booked: tuple[Collective, bool]) -> None:
        collective, in_data_wait = booked
        self._comm.done(collective)
        if in_data_wait:
            self.data_wait_started()

    def batches(self, loader: Iterable) -> Iterator:
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
        if self._pause is None:
            self._waiting_for_data = True
            self._wait_start = time.perf_counter()
            self._rank_clock.data_wait_started()

    def data_ready(self) -> None:
        if self._pause is None:
            self._waiting_for_data = False
            seconds = time.perf_counter() - self._wait_start
            self._host_data_wait += seconds
            self._metrics.host_data_wait.inc(seconds)
            self._rank_clock.data_ready(seconds)

    @contextmanager
    def forward(self) -> Iterator[None]:
        self.forward_started()
        yield
        self.forward_done()

    def forward_started(self) -> None:
        if self._pause is None:
            self._in_forward = True
            self._rank_clock.forward_started()

    def forward_done(self) -> None:
        if self._pause is None:
            self._in_forward = False
            self._forward_passes += 1
            self._metrics.forward_passes.inc()
            self._rank_clock.forward_done()

    def micro_batch(
        self, *, tokens: int | torch.Tensor | None = None, loss: float | torch.Tensor | None = None
    ) -> None:
        if self._pause is None:
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
        if self._pause is not None:
            return
        self._sums.add(loss, tokens)
        if compile_seconds is None:
            self._count_step(samples)
            self._rank_clock.step_done()
        else:
            self._step_compiled(samples, compile_seconds, recompiles)
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
        self.steps, self.epoch = step, epoch

    @contextmanager
    def pause(self, part: str) -> Iterator[None]:
        self.pause_started(part)
        try:
            yield
        finally:
            self.pause_ended(part)

    def pause_started(self, part: str) -> None:
        """`part`, one of trainstack/breakdown.py's PAUSES ("evaluation", "checkpoint_save", "checkpoint_load",
        "compile"); `pause_ended(part)` says it trains again. On a GPU the pause starts once the device has run the
        steps queued before it, which are step time."""
        if part not in breakdown.PAUSES:
            raise ValueError(f"no pause {part!r}: a pause is one of {', '.join(breakdown.PAUSES)}")
        if self._pause:
            raise ValueError(f"pause {part!r} started during pause {self._pause.part!r}: pauses do not nest")
        self._rank_clock.wait_for_device()
        self._pause = OpenPause(part, time.perf_counter(), time.time())
        self._publish(self._pause.started_at)

    def pause_ended(self, part: str) -> None:
        """The pause `part` is over: its time goes to that part, and the next step's clock starts now."""
        pause, self._pause = self._pause, None
        if pause is None or pause.part != part:
            raise ValueError(f"pause {part!r} ended, but {f'{pause.part!r}' if pause else 'none'} had started")
        seconds = time.perf_counter() - pause.started
        self._wall_time.paused(part, seconds, pause.started_at)
        self._resync_clock()
        if part == breakdown.CHECKPOINT_SAVE:
            self._checkpoint_done(seconds)

    def flush(self) -> None:
        self._record_open()
        if self._sums.micro_batches:
            self._open_interval()
            self._record_open()

    def close(self) -> None:
        """The closing line: the pauses since the last record (the final checkpoint and evaluation) and the time,
        which ends the rank's wall time. A rank that never stepped spent all of it starting. Returns once the
        collectives' threads hold none of the telemetry's callbacks, which would abort the exiting process."""
        try:
            self.flush()
        finally:
            self._close_records()

    # ---- the rank's time (trainstack/breakdown.py, trainstack/telemetry/wall_time.py) ------------------------
    def _measures(self, part: str) -> bool:
        """Whether this rank measures `part`: host-bound idle only on a GPU NVML answers for, exposed communication
        only on a watched DDP model. A part it does not measure has no series, rather than zeros."""
        return {breakdown.HOST_BOUND: self._rank_clock.measures_busy, breakdown.COMM_EXPOSED: self._comm_watched}.get(
            part, True
        )

    def _step_compiled(self, samples: int, seconds: float, recompiles: int) -> None:
        """A step that compiled counts as a step, but its time is compile time, not a step time."""
        self._count_step(samples)
        self._wall_time.compiled(seconds, time.time())
        self._resync_clock()
        self._metrics.compile_seconds.inc(seconds)
        self._metrics.recompiles.inc(recompiles)

    def _spent(self, part: str, seconds: float) -> None:
        self._metrics.time_of(part).inc(seconds)

    def _count_step(self, samples: int) -> None:
        self._wall_time.stepped(self._clock_started_at)
        self._samples += samples
        self._comm.step_done()
        self._metrics.steps.inc()
        self._metrics.samples.inc(samples)
        now = time.time()
        self._metrics.last_step.set(now)
        if now >= self._publish_at:
            self._publish(now)

    def _publish(self, now: float) -> None:
        """The held series (telemetry/metrics.py's HeldSeries) into the rank's file: every PUBLISH_SECONDS of steps,
        before a pause and at the end."""
        self._metrics.publish()
        self._comm_metrics.publish()
        self._publish_at = now + PUBLISH_SECONDS

    def _resync_clock(self) -> None:
        """After a checkpoint, an evaluation or a compiling step: that time is not a step, so it must not count as
        one."""
        self._clock_started_at = time.time()
        self._rank_clock.restart_step_clock()

    # ---- intervals --------------------------------------------------------------------------------------------
    def _open_interval(self) -> None:
        cut = self._cut_interval()
        # `interval_totals`' collective (trainstack's Trainer reduces the loss across its ranks there, once an
        # interval, outside any step) is the monitor's own, not the loop's: not booked, as before every collective was
        self._closing_interval = True
        try:
            totals = self._close_sums(self._sums)
        finally:
            self._closing_interval = False
        self._open = (cut, totals, self.steps, self.epoch, self._lr)

    def _record_open(self) -> None:
        if self._open is None:
            return
        cut, sums, step, epoch, lr = self._open
        self._open = None
        totals = sums.result()
        self.data_wait_share = self._record_interval(cut, step, epoch, totals.local_loss, lr, totals.local_tokens)

    def _cut_interval(self) -> IntervalCut:
        """Closes the interval's counts between two steps; `_record_interval` records them once its loss is known."""
        outside = self._wall_time.cut()
        cut = IntervalCut(
            samples=self._samples,
            times=self._rank_clock.cut(),
            host_data_wait=self._host_data_wait,
            forward_passes=self._forward_passes,
            comm_steps=self._comm.cut() if self._comm_watched else None,
            step_count=outside.step_count,
            compile_seconds=outside.compile_seconds,
            paused=outside.paused,
            not_stepping=outside.spans,
        )
        self._samples, self._host_data_wait, self._forward_passes = 0, 0.0, 0
        return cut

    def _record_interval(
        self, cut: IntervalCut, step: int, epoch: int, loss: float | None, lr: float | None, tokens: int
    ) -> float | None:
        """Records the interval; returns its data-wait share of step time (ratios.DATA_WAIT_SHARE, for the progress
        bar)."""
        times, ended = cut.times.read()
        step_seconds, data_wait, forward = times.step_seconds, times.data_wait_seconds, times.forward_seconds
        comm = self._comm.read(cut.comm_steps) if cut.comm_steps is not None else None
        if comm:
            forward = max(0.0, forward - sum(step.forward_exposed_seconds for step in comm))
        self._metrics.forward_seconds.inc(forward)
        # The samples NVML took while the device ran the interval: from the end of the previous one to now.
        busy = self._rank_clock.busy_share(self._interval_start, ended, cut.not_stepping)
        activity: dict[str, Any] = self._rank_clock.activity()  # GPM: SM and tensor-core activity
        interval = max(ended - self._interval_start, 1e-9)
        self._interval_start = ended
        stepped = sum(step_seconds) or interval
        comm_fields = self._record_comm(comm) if comm is not None else {}
        record = IntervalRecord(
            time=ended,
            rank=int(self.rank),
            step=step,
            epoch=epoch,
            loss=loss,
            lr=lr,
            samples=cut.samples,
            tokens=tokens,
            interval_seconds=interval,
            data_wait_seconds=data_wait,
            step_seconds=tuple(step_seconds),
            host_data_wait_seconds=cut.host_data_wait,
            clock=self.clock,
            forward_seconds=forward if cut.forward_passes else None,
            param_bytes=self._state_bytes.get("param_bytes"),
            grad_bytes=self._state_bytes.get("grad_bytes"),
            optimizer_state_bytes=self._state_bytes.get("optimizer_state_bytes"),
            **comm_fields,
            **self._record_time(cut, sum(step_seconds), data_wait, comm_fields.get("comm_exposed_seconds"), busy),
            **activity,
        )
        with self._storage_failures():
            self._records.write(record.to_json() + "\n")
        m = self._metrics
        m.tokens.inc(tokens)
        if loss is not None:  # a loop that gives its monitor no loss (or no learning rate) has none to show
            m.loss.set(loss)
        if lr is not None:
            m.learning_rate.set(lr)
        m.epoch.set(epoch)
        if m.memory_allocated_peak is not None and m.memory_reserved_peak is not None:
            m.memory_allocated_peak.set(torch.cuda.max_memory_allocated(self.device))
            m.memory_reserved_peak.set(torch.cuda.max_memory_reserved(self.device))
        if m.mfu is not None and self.peak:
            # Tokens this rank trained on over the time its steps took (a checkpoint or evaluation pause
            # in the interval is no step): docs/metrics.md.
            m.mfu.set(self.flops_per_token * tokens / stepped / self.peak)
        return ratios.DATA_WAIT_SHARE.of(data_wait, stepped)

    def _record_comm(self, steps: list[StepComm]) -> dict[str, Any]:
        """The interval's gradient communication into the counters, and as its record's fields."""
        fields = {
            "comm_seconds": sum(step.seconds for step in steps),
            "comm_exposed_seconds": sum(step.exposed_seconds for step in steps),
            "comm_bytes": sum(step.bytes for step in steps),
            "comm_buckets": sum(step.buckets for step in steps),
        }
        self._comm_metrics.seconds.inc(fields["comm_seconds"])
        self._comm_metrics.exposed.inc(fields["comm_exposed_seconds"])
        self._comm_metrics.bytes.inc(fields["comm_bytes"])
        return fields

    def _record_time(
        self, cut: IntervalCut, step_seconds: float, data_wait: float, comm_exposed: float | None, busy: float | None
    ) -> dict:
        """The interval's time by part into the counter, and as its record's fields (trainstack/breakdown.py)."""
        parts = breakdown.split_step_time(step_seconds, data_wait, comm_exposed or 0.0, busy)
        for part, seconds in parts.items():
            if self._measures(part):
                self._spent(part, seconds)
        return {
            "step_count": cut.step_count,
            "time_parts": {**parts, breakdown.COMPILE: cut.compile_seconds},
            "paused": pauses(cut.paused),
            "host_bound_measured": busy is not None,
        }

    def _state_measured(self, sizes: dict[str, int]) -> None:
        """The rank's parameter, gradient and optimizer-state bytes (`training_state_bytes`)."""
        self._state_bytes = sizes
        for key, value in sizes.items():
            self._metrics.state_bytes[key].set(value)

    def _checkpoint_done(self, duration: float) -> None:
        """A checkpoint was saved (its pause, "checkpoint_save", has ended): its time and how long it took."""
        self._metrics.last_checkpoint.set(time.time())
        self._metrics.checkpoint_duration.set(duration)

    @contextmanager
    def _storage_failures(self):
        """A records write the storage refused, as a WriteFailure; a cut-off line is ended by the next start."""
        try:
            yield
        except OSError as error:
            failure = write_failure(error, "the telemetry records", self._records_path)
            if failure is None:
                raise
            raise failure from None

    def _close_records(self) -> None:
        self._stop_publishing_progress()
        self._publish(time.time())
        self._unwatch_collectives()
        self._comm_callbacks.wait_released()
        settle_gloo_threads(self._on_gloo)
        ended = time.time()  # one instant: a rank that never stepped spent exactly its wall time starting
        since_the_last_record = self._wall_time.ended(ended)
        ending = SegmentEnded(
            ended, int(self.rank), since_the_last_record.step_count, pauses(since_the_last_record.paused)
        )
        for finish in (lambda: self._records.write(ending.to_json() + "\n"), self._records.close):
            try:
                finish()
            except OSError:
                pass  # a record's write failed and was reported (the segment then reads as killed)
        self._rank_clock.close()


# ---- saying so --------------------------------------------------------------------------------------------
def _say_once(message: str, _said: set[str] = set()) -> None:  # noqa: B006 (the set is the memory)
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr)
