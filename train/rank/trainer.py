"""One rank of a training run: config -> data -> model -> Accelerator.prepare -> loop -> summary.

Every rank runs this same code; Accelerate decides the device and shards the data. The loop's only cross-rank
traffic besides DDP's gradient all-reduce is one small reduction per log interval, which carries the loss, the
token count and the stop flag together.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    InitProcessGroupKwargs,
    broadcast_object_list,
    set_seed,
)
from tqdm import tqdm

import trainstack.monitor
from trainstack.breakdown import CHECKPOINT_LOAD, CHECKPOINT_SAVE, EVALUATION
from trainstack.errors import EXIT_CONFIG, EXIT_RUNTIME, ConfigError
from trainstack.hang import start_responder
from trainstack.heap import freeze_what_is_built
from trainstack.rundir import NON_BLOCKING_COPY_ENV, RUN_ID_ENV, RunDir, write_summary
from trainstack.telemetry.compiles import CompileWatch, NoCompileWatch
from trainstack.telemetry.interval import IntervalSums, PendingTotals
from trainstack.train.rank import checkpoint, outcome, sharding
from trainstack.train.rank.checkpointer import Checkpointer, drop_tied_aliases
from trainstack.train.rank.config import TrainConfig, require_device_support
from trainstack.train.rank.data import collate, load_token_data
from trainstack.train.rank.evaluation import evaluator
from trainstack.train.rank.loader_and_ddp import ddp_kwargs, loader_options
from trainstack.train.rank.model import build_model, estimate_flops_per_token, with_sync_batchnorm
from trainstack.train.rank.performance import (
    bucket_count,
    compile_in_place,
    make_optimizer,
    use_tf32,
)
from trainstack.train.rank.progress import Progress
from trainstack.train.rank.schedule import lr_scheduler
from trainstack.train.rank.segments import RunRecord
from trainstack.train.rank.static_graph import require_reduced_gradients
from trainstack.train.rank.step import nonfinite_weights, train_step
from trainstack.train.rank.stopping import StopRequested
from trainstack.write_failure import WriteFailure

DIVERGED_FIX = (
    "and nothing from it is saved; lower --learning-rate, clip with --max-grad-norm above 0, or drop "
    "--mixed-precision, then rerun: it resumes from the last checkpoint before it"
)


@dataclass(frozen=True)
class OpenInterval:
    """A log interval whose totals, reduced across the ranks, are on their way to the host."""

    totals: PendingTotals
    step: int
    epoch: int
    lr: float


class Trainer:
    """Its parts, each built once: the accelerator, the checkpointer, the rank's monitor (trainstack.monitor, the
    public API any loop can use) and the compile watch (objects doing nothing while off: `NullMonitor`,
    `NoCompileWatch`); the step, the evaluation, the LR schedule and the
    outcome are functions of their own (train/rank/step.py, evaluation.py, schedule.py, outcome.py)."""

    def __init__(self, config: TrainConfig, stop: StopRequested | None = None):
        self.config = config
        self.stop = stop or StopRequested()
        self.run_dir = RunDir(config.run_dir)
        self.started = time.time()
        fsdp_plugin = sharding.plugin_for(config)
        self.accelerator = Accelerator(
            mixed_precision=config.mixed_precision,
            dynamo_backend="no",  # --compile compiles the model itself; Accelerate must not compile it again
            gradient_accumulation_steps=config.grad_accum,
            step_scheduler_with_optimizer=False,  # the loop steps it once per optimizer step, on every rank
            dataloader_config=DataLoaderConfiguration(
                use_seedable_sampler=True,  # the order depends on (seed, epoch) only: resumes replay it exactly
                even_batches=True,  # every rank gets as many batches as the others: an uneven tail never hangs
                # A blocking copy of the (pinned) batch to the GPU waits for all the work queued on the stream,
                # so the host stalls in next() while the GPU still has work; non-blocking, it queues behind it.
                # On a CPU device the batch is already there and nothing is copied.
                non_blocking=os.environ.get(NON_BLOCKING_COPY_ENV, "1") != "0",
            ),
            kwargs_handlers=[
                InitProcessGroupKwargs(timeout=timedelta(seconds=config.collective_timeout)),
                ddp_kwargs(config),
            ],
            fsdp_plugin=fsdp_plugin,
        )
        if fsdp_plugin:
            sharding.enable_on_cpu_ranks(self.accelerator, fsdp_plugin)
        if config.telemetry and self.accelerator.num_processes > 1:
            # From here a wait in start-up has evidence too: the main process filling the datasets cache while the
            # others wait at Accelerate's barrier, DDP's first broadcast. The loop's monitor then says it is there.
            # A lone rank keeps no peer waiting under a timeout: its long start-up is no stall.
            start_responder(self.accelerator.process_index, starting=True)
        # Tied weights (the GPT's head is its embedding) are saved once, without safetensors' warning.
        self.accelerator.register_save_state_pre_hook(drop_tied_aliases)
        self.checkpointer = Checkpointer(
            self.accelerator,
            self.run_dir,
            config.strategy,
            config.keep_checkpoints,
            checkpoint.weights_shape(config.model, config.seq_len),
        )
        self.progress = Progress()
        self.record: RunRecord | None = None
        self.run_id = os.environ.get(RUN_ID_ENV, "manual")
        self.monitor: trainstack.monitor.TrainingMonitor = trainstack.monitor.NullMonitor()
        self.compile_watch: CompileWatch | NoCompileWatch = NoCompileWatch()
        self.evaluator = evaluator(compiled=config.compile)
        self.throughput: dict[str, float] = {}
        self._open_intervals: list[OpenInterval] = []
        self._in_loop = False  # the ranks step together: a collective closing an interval finds every rank
        # train/rank/static_graph.py: under DDP's static graph an output it cannot flatten leaves the ranks apart
        self.unchecked_static_graph = (
            config.strategy == "ddp" and config.ddp_static_graph and self.accelerator.num_processes > 1
        )

    # ---- building -------------------------------------------------------------------------------------------
    def build(self) -> None:
        config, accelerator = self.config, self.accelerator
        device = accelerator.device
        require_device_support(config, device.type == "cuda", accelerator.num_processes)
        if config.mixed_precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"{torch.cuda.get_device_name(device)} has no bf16; use --mixed-precision fp16")
        use_tf32(config, device)
        if config.strategy == "fsdp":
            sharding.require_fsdp(accelerator)
        # Every node's launcher names the run; rank 0's name wins, so all ranks label their series alike.
        self.run_id = broadcast_object_list([os.environ.get(RUN_ID_ENV, "manual")])[0]
        set_seed(config.seed)
        with accelerator.main_process_first():  # the main process fills the datasets cache; the others reuse it
            data = load_token_data(
                config.dataset, config.text_field, config.seq_len, config.eval_fraction, config.seed, config
            )
        model = with_sync_batchnorm(build_model(config, data.vocab_size), config, accelerator.num_processes)
        self.flops_per_token = estimate_flops_per_token(model, config.seq_len)
        if config.strategy == "fsdp":
            sharding.set_units(accelerator, config, model)
        on_gpu = device.type == "cuda"
        if config.compile:
            compile_in_place(model, config)
            self.compile_watch = CompileWatch(bucket_count(config))
            # A compiled model meets few shapes: lengths in --bucket-size steps, and no short last batch.
            padding = partial(collate, pad_to_multiple_of=config.bucket_size, max_width=config.seq_len)
        else:
            padding = partial(collate, pad_to_multiple_of=8 if on_gpu else 1)  # tensor cores like multiples of 8
        options = dict(batch_size=config.batch_size, collate_fn=padding, **loader_options(config, on_gpu))
        train_loader = torch.utils.data.DataLoader(data.train, shuffle=True, drop_last=config.compile, **options)
        eval_loader = torch.utils.data.DataLoader(data.eval, shuffle=False, **options) if len(data.eval) else None
        optimizer = make_optimizer(model, config, device)
        batches = (
            len(data.train) // config.batch_size if config.compile else math.ceil(len(data.train) / config.batch_size)
        )
        if not batches:
            raise ConfigError(
                f"--compile drops each epoch's incomplete last batch, and the {len(data.train)} "
                f"training samples do not fill one batch of {config.batch_size}; lower --batch-size"
            )
        self.steps_per_epoch = math.ceil(math.ceil(batches / accelerator.num_processes) / config.grad_accum)
        self.total_steps = min(s for s in (config.max_steps, config.epochs * self.steps_per_epoch) if s > 0)
        scheduler = lr_scheduler(optimizer, config, self.total_steps)
        prepared = accelerator.prepare(
            model, optimizer, train_loader, scheduler, *([eval_loader] if eval_loader else [])
        )
        self.model, self.optimizer, self.train_loader, self.scheduler = prepared[:4]
        self.eval_loader = prepared[4] if eval_loader else None
        # On the prepared model: its gradient communication (DDP's all-reduce, FSDP's) is what gets timed.
        self.monitor = trainstack.monitor.start(
            self.model,
            flops_per_token=self.flops_per_token,
            accelerator=accelerator,
            log_every=config.log_every,
            precision=config.mixed_precision,
            run_dir=self.run_dir.path,
            model_name=config.model,
            dataset=config.dataset,
            run_id=self.run_id,
            optimizer=self.optimizer,
            enabled=config.telemetry,
            interval_totals=self._close_interval,
        )

    # ---- the loop -------------------------------------------------------------------------------------------
    def train(self) -> str:
        p = self.progress
        bar = tqdm(
            total=self.total_steps,
            initial=p.step,
            disable=not self.accelerator.is_main_process,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        if p.step >= self.total_steps:
            return "completed"
        self.model.train()
        self.compile_watch.resync()
        self._in_loop = True
        try:
            return self._loop(bar)
        finally:
            self._in_loop = False

    def _loop(self, bar) -> str:
        config, accelerator, p = self.config, self.accelerator, self.progress
        while config.epochs == 0 or p.epoch < config.epochs:
            for batch in self._batches_of_epoch():
                loss = train_step(accelerator, self.model, self.optimizer, batch, config.max_grad_norm, self.monitor)
                tokens = batch["attention_mask"].sum()
                p.batch_in_epoch += 1
                if not accelerator.sync_gradients:
                    self.monitor.micro_batch(tokens=tokens, loss=loss)
                    continue
                self.scheduler.step()
                p.step += 1
                if self.unchecked_static_graph:
                    require_reduced_gradients(accelerator, self.model)
                    self.unchecked_static_graph = False
                compile_seconds, recompiles = self.compile_watch.step_done() or (None, 0)
                closed_before, self._open_intervals = self._open_intervals, []
                self.monitor.step(  # at an interval's end it closes the interval (`_close_interval`)
                    batch["input_ids"].shape[0] * config.grad_accum,
                    tokens=tokens,
                    loss=loss,
                    lr=self.scheduler.get_last_lr()[0],
                    epoch=p.epoch,
                    compile_seconds=compile_seconds,
                    recompiles=recompiles,
                )
                # The previous interval's totals, read now that this step is queued behind them.
                stop = self._log_intervals(closed_before, bar)  # the ranks agreed to stop
                last = p.step >= self.total_steps
                if last or stop:
                    self._log_through_now(bar)
                    return "completed" if last else "preempted"
                checkpoint_due = config.checkpoint_every and p.step % config.checkpoint_every == 0
                eval_due = config.eval_every and p.step % config.eval_every == 0
                if checkpoint_due or eval_due:
                    if self._log_through_now(bar):  # both need the progress up to now
                        return "preempted"
                    # evaluated first: the checkpoint then keeps its step's evaluation in the run's history
                    eval_loss = self.evaluate() if eval_due else None
                    if eval_loss is not None and accelerator.is_main_process:
                        bar.write(f"step {p.step}: eval loss {eval_loss:.4f}")  # above the bar, which stays
                    if checkpoint_due:
                        self.save()
            p.epoch += 1
            p.batch_in_epoch = 0
        self._log_through_now(bar)
        return "completed"

    def _batches_of_epoch(self):
        """This epoch's batches from where the run stands in it; the monitor times each wait for the loader."""
        self.train_loader.set_epoch(self.progress.epoch)  # a different shuffle each epoch, the same on every rank
        loader = self.train_loader
        if self.progress.batch_in_epoch:
            loader = self.accelerator.skip_first_batches(self.train_loader, self.progress.batch_in_epoch)
        yield from self.monitor.batches(loader)

    def _close_interval(self, sums: IntervalSums) -> PendingTotals:
        """The monitor's loss and token sums at an interval's end: in the loop, queues their one all-reduce and
        returns at once; `_log_intervals` reads it, normally after the next step is queued
        (trainstack/telemetry/interval.py says why). Outside it (a rank closing after an error) no other rank
        meets a collective: this rank's own, and nothing to log."""
        if not self._in_loop:
            return sums.take()
        p = self.progress
        totals = sums.start_reduce(self.accelerator, self.stop.requested)
        self._open_intervals.append(OpenInterval(totals, p.step, p.epoch, self.scheduler.get_last_lr()[0]))
        return totals

    def _log_intervals(self, intervals: list[OpenInterval], bar) -> bool:
        """The intervals' totals into the progress and the bar; True when the ranks agreed to stop."""
        stop = False
        for interval in intervals:
            stop = self._log_interval(interval, bar) or stop
        return stop

    def _log_interval(self, interval: OpenInterval, bar) -> bool:
        accelerator, p = self.accelerator, self.progress
        totals = interval.totals.result()
        if totals.loss is not None and not math.isfinite(
            totals.loss
        ):  # the mean over every rank: all of them stop here, before a save
            raise ConfigError(
                f"the loss is {totals.loss} over the steps up to {interval.step}: training diverged, {DIVERGED_FIX}"
            )
        p.last_loss = totals.loss
        if p.initial_loss is None:
            p.initial_loss = totals.loss
        p.tokens += totals.tokens
        p.samples += self.config.batch_size * totals.micro_batches * accelerator.num_processes
        postfix = dict(loss=f"{totals.loss:.4f}", lr=f"{interval.lr:.2e}", epoch=interval.epoch)
        if (share := self.monitor.data_wait_share) is not None:
            # Named for what it measures: a GPU starved of batches, or a CPU rank blocked in the loader.
            postfix["gpu_starved" if accelerator.device.type == "cuda" else "data_wait"] = f"{share:.0%}"
        bar.update(interval.step - bar.n)
        bar.set_postfix(**postfix)
        return totals.stop

    def _log_through_now(self, bar) -> bool:
        """Logs the open interval and the steps since, waiting for the device (a checkpoint, an evaluation or
        the end of the loop needs the progress up to now); True when the ranks agreed to stop."""
        self.monitor.flush()  # closes the steps since the last interval's end (`_close_interval`)
        intervals, self._open_intervals = self._open_intervals, []
        return self._log_intervals(intervals, bar)

    def save(self) -> None:
        if not self.checkpointer.due(self.progress.step):
            return
        assert self.record is not None, "run() starts the record before the loop that saves"
        if count := nonfinite_weights(self.accelerator, self.model):
            raise ConfigError(
                f"{count} of the model's weights are inf or nan after step {self.progress.step}: training diverged, "
                + DIVERGED_FIX
            )
        with self.monitor.pause(CHECKPOINT_SAVE):
            self.checkpointer.save(self.progress, self.record)
        self.compile_watch.resync()

    def evaluate(self) -> float | None:
        """The mean loss over the evaluation data, kept in the progress (summary.json's `evaluations`)."""
        if self.eval_loader is None:
            return None
        with self.monitor.pause(EVALUATION):
            loss = self.evaluator(self.accelerator, self.model, self.eval_loader)
        self.compile_watch.resync()  # that pause was not compiling either
        self.progress.evaluations.append({"step": self.progress.step, "loss": loss})
        return loss

    # ---- outcome --------------------------------------------------------------------------------------------
    def write_summary(self, exit_reason: str, exit_code: int, eval_loss: float | None, error: str | None) -> None:
        if not self.accelerator.is_main_process:
            return
        write_summary(
            self.run_dir.summary,
            outcome.summary(
                self.accelerator,
                self.config,
                self.progress,
                run_id=self.run_id,
                started=self.started,
                throughput=self.throughput,
                compile_watch=self.compile_watch,
                segments=self.record.segments(self.progress, exit_reason) if self.record else [],
                exit_reason=exit_reason,
                exit_code=exit_code,
                eval_loss=eval_loss,
                error=error,
            ),
        )

    def run(self) -> int:
        try:
            self.build()
            freeze_what_is_built()
            with self.monitor.pause(CHECKPOINT_LOAD):
                restored = self.checkpointer.resume(self.config.resume, self.progress)
            self.monitor.resumed_at(self.progress.step, self.progress.epoch)
            self.record = RunRecord(self.run_id, self.progress, restored, lambda: self.compile_watch.seconds or 0.0)
            self.record.loop_begins()
            exit_reason = self.train()
            self.record.loop_ends(exit_reason)
            self.throughput = self.record.throughput(self.progress)
            eval_loss = self.evaluate() if exit_reason == "completed" else None  # a stop saves at once
            self.save()
            if exit_reason == "completed" and eval_loss is not None:
                self.accelerator.print(f"eval loss {eval_loss:.4f}")
            code = outcome.EXIT_CODES[exit_reason]
            self.write_summary(exit_reason, code, eval_loss, None)
            # Tear down together: a rank that leaves while a peer still has collective work in flight can make
            # the peer's gloo threads abort at interpreter exit. destroy_process_group() frees NCCL/gloo state.
            self.accelerator.wait_for_everyone()
            self.accelerator.end_training()
            return code
        except WriteFailure as error:
            note = checkpoint.resume_note(self.run_dir.checkpoints)
            return self._fail(outcome.Failure(f"{error}; {note}", EXIT_RUNTIME))
        except ConfigError as error:
            return self._fail(outcome.Failure(str(error), EXIT_CONFIG))
        except RuntimeError as error:
            failure = outcome.explain_runtime_error(error, self.config, stopping=self.stop.requested)
            if failure is None:
                raise
            return self._fail(failure)
        finally:
            self.monitor.close()
            self.compile_watch.close()

    def _fail(self, failure: outcome.Failure) -> int:
        outcome.report_failure(self.accelerator.process_index, failure)
        try:
            self.write_summary("failed", failure.exit_code, None, failure.message)
        except (OSError, WriteFailure):
            pass  # the line above has said what failed
        if failure.peer_lost:
            time.sleep(outcome.PEER_LOST_EXIT_DELAY_SECONDS)
        return failure.exit_code
