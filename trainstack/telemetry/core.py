"""A rank's telemetry, interval by interval: prometheus_client multiprocess files for the exporter, JSON lines for the
run report.

Nothing here talks to another rank or waits on one: each rank writes its own memory-mapped files (a few
microseconds per step) and appends one JSON line per log interval. The loss it publishes is the rank's own (the
monitor sums it on the device, trainstack/monitor.py): ranks whose losses part for long train on different data.

It also says where the rank's wall time goes (trainstack/breakdown.py): each interval's step time split into its
parts, the pauses the loop reports (`pause_started`, `pause_ended`), the startup from the launch to the first step,
and, as the rank exits, a closing line whose time ends the rank's wall time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainstack import breakdown, ratios
from trainstack.hang import start_responder
from trainstack.record import IntervalRecord, SegmentEnded, pauses
from trainstack.rundir import METRICS_DIR_ENV, RunDir
from trainstack.telemetry.clock import PendingTimes, RankClock, clock_for
from trainstack.telemetry.comm import watch_gradient_communication
from trainstack.telemetry.comm_setup import CommSetup
from trainstack.telemetry.comm_timer import CommTimer, StepComm
from trainstack.telemetry.device import RankIdentity
from trainstack.telemetry.future_callbacks import FutureCallbacks
from trainstack.telemetry.metrics import CommMetrics, RankMetrics
from trainstack.telemetry.records import launch_time, open_records
from trainstack.write_failure import write_failure


@dataclass(frozen=True)
class IntervalCut:
    """A log interval's counts, taken between its last step and the next one."""

    samples: int
    times: PendingTimes  # step, data-wait and forward times, on the rank's clock (clock.py)
    forward_passes: int
    host_data_wait: float
    comm_steps: list | None  # the steps' gradient-communication marks (CommTimer.cut); None where unmeasured
    step_count: int  # optimizer steps, those that compiled included
    compile_seconds: float  # of the steps that compiled
    paused: list[dict]  # the pauses (and the startup) that ended in it: {"part", "seconds", "after_steps"}
    not_stepping: list[tuple[float, float]]  # unix-time spans of the startup, pauses and compiling steps


@dataclass(frozen=True)
class OpenPause:
    part: str
    started: float  # perf_counter()
    started_at: float  # unix time


class Telemetry:
    def __init__(
        self, run_dir: Path, identity: RankIdentity, flops_per_token: float, peak: float | None, device: torch.device
    ):
        self.rank = str(identity.rank)
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.device = device
        # What measures the step, forward and data-wait times (trainstack/telemetry/clock.py); it starts with the
        # first step's clock, below
        clock = clock_for(device)
        self.clock = clock.name
        self._comm_metrics = CommMetrics.off()  # until a watched model communicates
        self._comm_watched = False
        self._identity = identity
        self._metrics = (
            RankMetrics.build(identity, self.clock, device.type == "cuda", bool(peak))
            if os.environ.get(METRICS_DIR_ENV)
            else RankMetrics.off()
        )  # no metrics directory: no series
        self._launched_at = launch_time()
        start_responder(identity.rank)  # hang evidence on the launcher's request (trainstack/hang.py)
        self._records_path = RunDir(run_dir).rank_records(identity.rank)
        with self._storage_failures():
            self._records_path.parent.mkdir(parents=True, exist_ok=True)
            self._records = open_records(self._records_path, identity, self._launched_at)
        self._interval_start = time.time()
        self._rank_clock: RankClock = clock.start(identity.uuid, self._metrics)
        self._clock_started_at = self._interval_start  # unix time the step clock last (re)started
        self._comm: CommTimer = CommTimer(self._rank_clock.marks, in_forward=lambda: self._in_forward)
        self._comm_callbacks = FutureCallbacks()
        self._host_data_wait = 0.0
        self._wait_start = 0.0
        self._samples = 0
        self._in_forward = False
        self._forward_passes = 0
        self._state_bytes: dict[str, int] = {}
        # Where the time goes (trainstack/breakdown.py): this interval's pauses and compiling steps, and the startup
        # until the first step.
        self._starting = True
        self._paused_while_starting = 0.0
        self._pause: OpenPause | None = None
        self._step_count = 0
        self._compile_seconds = 0.0
        self._paused: list[dict] = []
        self._not_stepping: list[tuple[float, float]] = []
        # Every part this rank measures is a series from the start: a rate needs two samples
        for part in filter(self._measures, breakdown.LIVE_PARTS):
            self._metrics.time.labels(self.rank, part)

    def _measures(self, part: str) -> bool:
        """Whether this rank measures `part`: host-bound idle only on a GPU NVML answers for, exposed communication
        only on a watched DDP model. A part it does not measure has no series, rather than zeros."""
        return {breakdown.HOST_BOUND: self._rank_clock.measures_busy, breakdown.COMM_EXPOSED: self._comm_watched}.get(
            part, True
        )

    def watch_communication(self, model: torch.nn.Module, comm_hook: Callable | None = None) -> bool:
        """Times the communication of a DDP or FSDP model (trainstack/telemetry/comm.py), a DDP model's through
        `comm_hook` where given; False for any other."""
        self._comm_watched = watch_gradient_communication(
            model, self._comm, self._comm_callbacks, training=lambda: self._pause is None, comm_hook=comm_hook
        )
        if self._comm_watched and os.environ.get(METRICS_DIR_ENV):
            self._comm_metrics = CommMetrics.build(self._identity)
            CommSetup.read().publish(self.rank)  # what diagnose's comm-bound evidence names
        if self._comm_watched:
            self._metrics.time.labels(self.rank, breakdown.COMM_EXPOSED)
        return self._comm_watched

    def forward_started(self) -> None:
        """Forward time says which part of a straggler's step is slow. The waits for collectives inside it (DDP's
        buffer broadcast, FSDP's all-gathers) are communication, taken out when the interval is read."""
        self._in_forward = True
        self._rank_clock.forward_started()

    def forward_done(self) -> None:
        self._in_forward = False
        self._forward_passes += 1
        self._metrics.forward_passes.inc()
        self._rank_clock.forward_done()

    def data_wait_started(self) -> None:
        """The loop is about to ask the loader for the next batch."""
        self._wait_start = time.perf_counter()
        self._rank_clock.data_wait_started()

    def data_ready(self) -> None:
        """The loader answered (a batch, now on the device, or the end of the epoch)."""
        seconds = time.perf_counter() - self._wait_start
        self._host_data_wait += seconds
        self._metrics.host_data_wait.inc(seconds)
        self._rank_clock.data_ready(seconds)

    def step_done(self, samples: int) -> None:
        self._count_step(samples)
        self._rank_clock.step_done()

    def step_compiled(self, samples: int, seconds: float, recompiles: int) -> None:
        """A step that compiled counts as a step, but its time is compile time, not a step time."""
        self._count_step(samples)
        now = time.time()
        self._compile_seconds += seconds
        self._not_stepping.append((now - seconds, now))
        self._spent(breakdown.COMPILE, seconds)
        self.resync_clock()
        self._metrics.compile_seconds.inc(seconds)
        self._metrics.recompiles.inc(recompiles)

    def pause_started(self, part: str) -> None:
        """The loop stops training for `part`, one of trainstack/breakdown.py's PAUSES ("evaluation",
        "checkpoint_save", "checkpoint_load", "compile"); `pause_ended(part)` says it trains again. On a GPU the
        pause starts once the device has run the steps queued before it, which are step time."""
        if part not in breakdown.PAUSES:
            raise ValueError(f"no pause {part!r}: a pause is one of {', '.join(breakdown.PAUSES)}")
        if self._pause:
            raise ValueError(f"pause {part!r} started during pause {self._pause.part!r}: pauses do not nest")
        self._rank_clock.wait_for_device()
        self._pause = OpenPause(part, time.perf_counter(), time.time())

    def pause_ended(self, part: str) -> float:
        """The pause `part` is over: its time goes to that part, and the next step's clock starts now. Returns
        its seconds."""
        pause, self._pause = self._pause, None
        if pause is None or pause.part != part:
            raise ValueError(f"pause {part!r} ended, but {f'{pause.part!r}' if pause else 'none'} had started")
        seconds = time.perf_counter() - pause.started
        if self._starting:
            self._paused_while_starting += seconds
        self._not_training(part, seconds, (pause.started_at, pause.started_at + seconds))
        self.resync_clock()
        return seconds

    def _not_training(self, part: str, seconds: float, span: tuple[float, float]) -> None:
        """A pause or the startup: into this interval's record, after the steps counted so far."""
        self._paused.append({"part": part, "seconds": seconds, "after_steps": self._step_count})
        self._not_stepping.append(span)
        self._spent(part, seconds)

    def _spent(self, part: str, seconds: float) -> None:
        self._metrics.time.labels(self.rank, part).inc(seconds)

    def _end_startup(self, at: float) -> None:
        """Startup runs from the launch to `at`, the start of the first step's clock, less the pauses before it."""
        self._starting = False
        self._not_training(
            breakdown.STARTUP, max(0.0, at - self._launched_at - self._paused_while_starting), (self._launched_at, at)
        )

    def _count_step(self, samples: int) -> None:
        if self._starting:
            self._end_startup(self._clock_started_at)
        self._step_count += 1
        self._samples += samples
        self._comm.step_done()
        self._metrics.steps.inc()
        self._metrics.samples.inc(samples)
        self._metrics.last_step.set(time.time())

    def resync_clock(self) -> None:
        """After a checkpoint or evaluation: that pause is not a step, so it must not count as one."""
        self._clock_started_at = time.time()
        self._rank_clock.restart_step_clock()

    def interval_ended(self) -> IntervalCut:
        """Closes the interval's counts between two steps; `interval_done` records them once its loss is known."""
        cut = IntervalCut(
            samples=self._samples,
            times=self._rank_clock.cut(),
            host_data_wait=self._host_data_wait,
            forward_passes=self._forward_passes,
            comm_steps=self._comm.cut() if self._comm_watched else None,
            step_count=self._step_count,
            compile_seconds=self._compile_seconds,
            paused=self._paused,
            not_stepping=self._not_stepping,
        )
        self._samples, self._host_data_wait, self._forward_passes = 0, 0.0, 0
        self._step_count, self._compile_seconds, self._paused, self._not_stepping = 0, 0.0, [], []
        return cut

    def interval_done(
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

    def state_measured(self, sizes: dict[str, int]) -> None:
        """The rank's parameter, gradient and optimizer-state bytes (`training_state_bytes`)."""
        self._state_bytes = sizes
        for key, value in sizes.items():
            self._metrics.state_bytes[key].set(value)

    def checkpoint_done(self, duration: float) -> None:
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

    def close(self) -> None:
        """The closing line: the pauses since the last record (the final checkpoint and evaluation) and the time,
        which ends the rank's wall time. A rank that never stepped spent all of it starting. Returns once the
        collectives' threads hold none of the telemetry's callbacks, which would abort the exiting process."""
        self._comm_callbacks.wait_released()
        if self._starting:
            self._end_startup(time.time())
        ending = SegmentEnded(time.time(), int(self.rank), self._step_count, pauses(self._paused))
        for finish in (lambda: self._records.write(ending.to_json() + "\n"), self._records.close):
            try:
                finish()
            except OSError:
                pass  # a record's write failed and was reported (the segment then reads as killed)
        self._rank_clock.close()
