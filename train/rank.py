"""One rank of a training run: config -> data -> model -> Accelerator.prepare -> loop -> summary.

Every rank runs this same code; Accelerate decides the device and shards the data. The loop's only cross-rank
traffic besides DDP's gradient all-reduce is one small reduction per log interval, which carries the loss, the
token count and the stop flag together.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
    broadcast_object_list,
    set_seed,
)
from tqdm import tqdm

from train import checkpoint, sharding
from train.config import TrainConfig, require_device_support
from train.data import collate, load_token_data
from train.model import build_model, estimate_flops_per_token, loss_of
from train.performance import (
    CompileWatch,
    bucket_count,
    compile_in_place,
    make_optimizer,
    use_tf32,
)
from train.segments import SEGMENTS_KEY, RunRecord
from train.telemetry import (
    RankIdentity,
    Telemetry,
    device_uuid,
    peak_flops,
    progress_by_rank,
    training_state_bytes,
)
from trainstack.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, ConfigError
from trainstack.rundir import METRICS_DIR_ENV, NNODES_ENV, NON_BLOCKING_COPY_ENV, RUN_ID_ENV, RunDir, write_summary


class StopRequested:
    """SIGTERM/SIGINT only set a flag: the ranks agree on it at the next log interval and stop together."""

    def __init__(self) -> None:
        self.requested = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already trained on: where a resume starts reading
    initial_loss: float | None = None
    last_loss: float | None = None
    samples: int = 0  # all ranks
    tokens: int = 0  # all ranks
    resumed_from: str | None = None

    def state(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "initial_loss": self.initial_loss, "last_loss": self.last_loss,
                "samples": self.samples, "tokens": self.tokens}


class Trainer:
    def __init__(self, config: TrainConfig):
        self.config = config
        self.stop = StopRequested()
        self.run_dir = RunDir(config.run_dir)
        self.checkpoints = self.run_dir.checkpoints
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
                DistributedDataParallelKwargs(find_unused_parameters=config.find_unused_parameters),
            ],
            fsdp_plugin=fsdp_plugin,
        )
        if fsdp_plugin:
            sharding.enable_on_cpu_ranks(self.accelerator, fsdp_plugin)
        # Tied weights (the GPT's head is its embedding) are saved once, without safetensors' warning.
        self.accelerator.register_save_state_pre_hook(checkpoint.drop_tied_aliases)
        self.progress = Progress()
        self.record: RunRecord | None = None
        self.restored_segments: list[dict] = []
        self.run_id = os.environ.get(RUN_ID_ENV, "manual")
        self.telemetry: Telemetry | None = None
        self.compile_watch: CompileWatch | None = None
        self.throughput: dict[str, float] = {}

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
            data = load_token_data(config.dataset, config.text_field, config.seq_len, config.eval_fraction,
                                   config.seed, config)
        model = build_model(config, data.vocab_size)
        if config.sync_batchnorm and accelerator.num_processes > 1:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.flops_per_token = estimate_flops_per_token(model, config.seq_len)
        if config.strategy == "fsdp":
            sharding.set_units(accelerator, config, model)
        on_gpu = device.type == "cuda"
        if config.compile:
            compile_in_place(model, config)
            self.compile_watch = CompileWatch(bucket_count(config))
            # Evaluation runs eagerly: it is rare, and compiled it would add graphs for eval mode and its shapes.
            self.evaluate = torch.compiler.set_stance("force_eager")(self.evaluate)
            # A compiled model meets few shapes: lengths in --bucket-size steps, and no short last batch.
            padding = partial(collate, pad_to_multiple_of=config.bucket_size, max_width=config.seq_len)
        else:
            padding = partial(collate, pad_to_multiple_of=8 if on_gpu else 1)  # tensor cores like multiples of 8
        loader_options = dict(
            batch_size=config.batch_size,
            collate_fn=padding,
            num_workers=config.num_workers,
            pin_memory=on_gpu,  # page-locked host memory: the copy to the GPU overlaps compute
            persistent_workers=config.num_workers > 0,  # no worker start-up cost at each epoch
        )
        train_loader = torch.utils.data.DataLoader(data.train, shuffle=True, drop_last=config.compile,
                                                   **loader_options)
        eval_loader = torch.utils.data.DataLoader(data.eval, shuffle=False, **loader_options) if len(
            data.eval) else None
        optimizer = make_optimizer(model, config, device)
        batches = len(data.train) // config.batch_size if config.compile else math.ceil(
            len(data.train) / config.batch_size)
        if not batches:
            raise ConfigError(f"--compile drops each epoch's incomplete last batch, and the {len(data.train)} "
                              f"training samples do not fill one batch of {config.batch_size}; lower --batch-size")
        self.steps_per_epoch = math.ceil(math.ceil(batches / accelerator.num_processes) / config.grad_accum)
        self.total_steps = min(s for s in (config.max_steps, config.epochs * self.steps_per_epoch) if s > 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_factor)
        prepared = accelerator.prepare(model, optimizer, train_loader, scheduler, *([eval_loader] if eval_loader
                                                                                     else []))
        self.model, self.optimizer, self.train_loader, self.scheduler = prepared[:4]
        self.eval_loader = prepared[4] if eval_loader else None
        self.telemetry = self._make_telemetry() if config.telemetry else None
        if self.telemetry:
            self._state_hook = self.optimizer.optimizer.register_step_post_hook(self._measure_state)

    def _measure_state(self, optimizer, args, kwargs) -> None:
        """Once, at the first optimizer step: the sizes stay the same for the rest of the run."""
        self._state_hook.remove()
        self.telemetry.state_measured(training_state_bytes(self.model, optimizer))

    def _lr_factor(self, step: int) -> float:
        warmup = self.config.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        remaining = max(self.total_steps - warmup, 1)
        done = min((step - warmup) / remaining, 1.0)
        if self.config.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * done))
        if self.config.lr_schedule == "linear":
            return 1 - done
        return 1.0

    def _make_telemetry(self) -> Telemetry:
        accelerator, config = self.accelerator, self.config
        identity = RankIdentity(
            rank=accelerator.process_index, local_rank=accelerator.local_process_index, node=socket.gethostname(),
            uuid=device_uuid(accelerator.device), run_id=self.run_id,
            world_size=accelerator.num_processes,
            nodes=int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get(NNODES_ENV, "1")) or 1),
            mixed_precision=config.mixed_precision, model=config.model, dataset=config.dataset,
            strategy=config.strategy,
        )
        return Telemetry(self.run_dir.path, identity, self.flops_per_token,
                         peak_flops(accelerator.device, config.mixed_precision, config.tf32), accelerator.device)

    def resume(self) -> None:
        config, accelerator = self.config, self.accelerator
        # The main process goes first: it clears unsealed leftovers and sets damaged checkpoints aside, then the
        # other ranks resolve the same checkpoint from the tidied folder.
        with accelerator.main_process_first():
            if config.resume == "auto" and accelerator.is_main_process:
                checkpoint.remove_unsealed(self.checkpoints)
            folder = checkpoint.resolve_resume(config.resume, self.checkpoints, accelerator.print)
        if folder is None:
            return
        state = checkpoint.read_train_state(folder)
        checkpoint.require_strategy(folder, state, config.strategy)
        accelerator.load_state(str(folder))  # FSDP: each rank reads the shards it now owns, at any world size
        p = self.progress
        p.step, p.epoch = state["step"], state["epoch"]
        p.batch_in_epoch = checkpoint.batches_per_rank(state, accelerator.num_processes)
        p.initial_loss, p.last_loss = state["initial_loss"], state["last_loss"]
        p.samples, p.tokens = state["samples"], state["tokens"]
        p.resumed_from = str(folder)
        self.restored_segments = state.get(SEGMENTS_KEY, [])
        self.accelerator.print(f"resumed from {folder} at step {p.step}")

    # ---- the loop -------------------------------------------------------------------------------------------
    def train(self) -> str:
        config, accelerator, p = self.config, self.accelerator, self.progress
        bar = tqdm(total=self.total_steps, initial=p.step, disable=not accelerator.is_main_process,
                   desc="train", unit="step", dynamic_ncols=True)
        loss_sum = torch.zeros((), device=accelerator.device)
        tokens = torch.zeros((), device=accelerator.device, dtype=torch.long)
        micro_batches = 0
        if p.step >= self.total_steps:
            return "completed"
        self.model.train()
        if self.compile_watch:
            self.compile_watch.resync()
        while config.epochs == 0 or p.epoch < config.epochs:
            self.train_loader.set_epoch(p.epoch)  # a different shuffle each epoch, the same on every rank
            loader = self.train_loader
            if p.batch_in_epoch:
                loader = accelerator.skip_first_batches(self.train_loader, p.batch_in_epoch)
            batches = iter(loader)
            while True:
                if self.telemetry:
                    self.telemetry.data_wait_started()
                batch = next(batches, None)
                if self.telemetry:
                    self.telemetry.data_ready()
                if batch is None:
                    break
                with accelerator.accumulate(self.model):
                    if self.telemetry:
                        self.telemetry.forward_started()
                    loss = loss_of(self.model(**batch))
                    if self.telemetry:
                        self.telemetry.forward_done()
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and config.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                loss_sum += loss.detach().float()
                tokens += batch["attention_mask"].sum()
                micro_batches += 1
                p.batch_in_epoch += 1
                if not accelerator.sync_gradients:
                    continue
                self.scheduler.step()
                p.step += 1
                compiled = self.compile_watch.step_done() if self.compile_watch else None
                if self.telemetry and compiled:
                    self.telemetry.step_compiled(batch["input_ids"].shape[0] * config.grad_accum, *compiled)
                elif self.telemetry:
                    self.telemetry.step_done(batch["input_ids"].shape[0] * config.grad_accum)
                last = p.step >= self.total_steps
                if last or p.step % config.log_every == 0 or p.step == 1:
                    stop = self._log_interval(loss_sum, tokens, micro_batches, bar)
                    loss_sum.zero_()
                    tokens.zero_()
                    micro_batches = 0
                    if stop:
                        return "preempted"
                if last:
                    return "completed"
                if config.checkpoint_every and p.step % config.checkpoint_every == 0:
                    self.save()
                if config.eval_every and p.step % config.eval_every == 0:
                    self.evaluate()
            p.epoch += 1
            p.batch_in_epoch = 0
        if micro_batches:
            self._log_interval(loss_sum, tokens, micro_batches, bar)
        return "completed"

    def _log_interval(self, loss_sum, tokens, micro_batches: int, bar) -> bool:
        """One all-reduce: the loss mean over all ranks, their tokens and samples, and whether any must stop."""
        accelerator, p = self.accelerator, self.progress
        local_tokens = int(tokens.item())
        stats = torch.stack([
            loss_sum.double(), torch.tensor(float(micro_batches), device=loss_sum.device).double(),
            torch.tensor(float(local_tokens), device=loss_sum.device).double(),
            torch.tensor(float(self.stop.requested), device=loss_sum.device).double(),
        ])
        total = accelerator.reduce(stats, reduction="sum").tolist()
        loss = total[0] / max(total[1], 1)
        p.last_loss = loss
        if p.initial_loss is None:
            p.initial_loss = loss
        p.tokens += int(total[2])
        samples = self.config.batch_size * micro_batches * accelerator.num_processes
        p.samples += samples
        lr = self.scheduler.get_last_lr()[0]
        postfix = dict(loss=f"{loss:.4f}", lr=f"{lr:.2e}", epoch=p.epoch)
        if self.telemetry:
            share = self.telemetry.interval_done(p.step, p.epoch, loss, lr, local_tokens)
            # Named for what it measures: a GPU starved of batches, or a CPU rank blocked in the loader.
            postfix["gpu_starved" if self.telemetry.clock == "gpu" else "data_wait"] = f"{share:.0%}"
        bar.update(p.step - bar.n)
        bar.set_postfix(**postfix)
        return total[3] > 0

    def save(self) -> None:
        """Every rank writes its part into a temporary folder; the main process seals and publishes it."""
        accelerator, p = self.accelerator, self.progress
        final = self.run_dir.checkpoint(p.step)
        if final.exists():  # resumed here and stopped again before the next step: already saved
            return
        started = time.time()
        temporary = self.run_dir.unsealed_checkpoint(p.step)
        if accelerator.is_main_process:
            checkpoint.remove_unsealed(self.checkpoints)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(temporary))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            checkpoint.seal(temporary, {**p.state(), "world_size": accelerator.num_processes,
                                        "strategy": self.config.strategy,
                                        SEGMENTS_KEY: self.record.segments(p) if self.record else []})
            checkpoint.publish(temporary, final)
            checkpoint.rotate(self.checkpoints, self.config.keep_checkpoints)
        accelerator.wait_for_everyone()
        if self.telemetry:
            self.telemetry.checkpoint_done(time.time() - started)
        if self.compile_watch:
            self.compile_watch.resync()

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Token-weighted mean loss over the whole eval set; gather_for_metrics drops the evenness padding."""
        if self.eval_loader is None:
            return None
        self.model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        for batch in self.eval_loader:
            output = self.model(**batch)
            logits = getattr(output, "logits", None)
            labels = batch["labels"][:, 1:]
            counts = (labels != -100).sum(dim=1).double()
            if logits is not None:
                per_token = torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
                sums = per_token.sum(dim=1).double()
            else:
                sums = loss_of(output).double() * counts
            gathered = self.accelerator.gather_for_metrics(torch.stack([sums, counts], dim=1))
            totals += gathered.sum(dim=0)
        self.model.train()
        if self.telemetry:
            self.telemetry.resync_clock()
        if self.compile_watch:
            self.compile_watch.resync()
        return (totals[0] / totals[1].clamp(min=1)).item()

    # ---- outcome --------------------------------------------------------------------------------------------
    def write_summary(self, exit_reason: str, exit_code: int, eval_loss: float | None, error: str | None) -> None:
        accelerator, p = self.accelerator, self.progress
        if not accelerator.is_main_process:
            return
        summary = {
            "run_id": self.run_id,
            "world_size": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type).split(".")[-1],
            "device": str(accelerator.device.type),
            "mixed_precision": self.config.mixed_precision,
            "model": self.config.model,
            "dataset": self.config.dataset,
            "steps": p.step,
            "epochs": p.epoch + (p.batch_in_epoch > 0),
            "initial_loss": p.initial_loss,
            "final_loss": p.last_loss,
            "eval_loss": eval_loss,
            "samples_per_second": self.throughput.get("samples_per_second"),  # over all segments
            "tokens_per_second": self.throughput.get("tokens_per_second"),
            "compile_seconds": self.compile_watch.seconds if self.compile_watch else None,
            "recompiles": self.compile_watch.recompiles if self.compile_watch else None,
            "wall_seconds": time.time() - self.started,
            "resumed_from": p.resumed_from,
            "exit_reason": exit_reason,
            "exit_code": exit_code,
            "error": error,
            SEGMENTS_KEY: self.record.segments(p, exit_reason) if self.record else [],
        }
        write_summary(self.run_dir.summary, summary)

    def run(self) -> int:
        try:
            self.build()
            self.resume()
            self.record = RunRecord(self.run_id, self.progress, self.restored_segments,
                                    lambda: self.compile_watch.seconds if self.compile_watch else 0.0)
            self.record.loop_begins()
            exit_reason = self.train()
            self.record.loop_ends(exit_reason)
            self.throughput = self.record.throughput(self.progress)
            self.save()
            eval_loss = self.evaluate() if exit_reason == "completed" else None
            if exit_reason == "completed" and eval_loss is not None:
                self.accelerator.print(f"eval loss {eval_loss:.4f}")
            code = EXIT_OK if exit_reason == "completed" else EXIT_PREEMPTED
            self.write_summary(exit_reason, code, eval_loss, None)
            # Tear down together: a rank that leaves while a peer still has collective work in flight can make
            # the peer's gloo threads abort at interpreter exit. destroy_process_group() frees NCCL/gloo state.
            self.accelerator.wait_for_everyone()
            self.accelerator.end_training()
            return code
        except ConfigError as error:
            self._fail(EXIT_CONFIG, str(error))
            return EXIT_CONFIG
        except RuntimeError as error:
            message = explain_runtime_error(error, self.config)
            if message is None:
                raise
            self._fail(EXIT_CONFIG if "find_unused_parameters" in message else EXIT_FAILED, message)
            return EXIT_CONFIG if "find_unused_parameters" in message else EXIT_FAILED
        finally:
            if self.telemetry:
                self.telemetry.close()
            if self.compile_watch:
                self.compile_watch.close()

    def _fail(self, code: int, message: str) -> None:
        print(f"trainstack rank {self.accelerator.process_index}: error: {message}", file=sys.stderr, flush=True)
        try:
            self.write_summary("failed", code, None, message)
        except OSError:
            pass


def explain_runtime_error(error: RuntimeError, config: TrainConfig) -> str | None:
    """Turn the distributed failures users meet into what to do about them; None means a genuine bug."""
    text = str(error)
    if "find_unused_parameters" in text or "did not receive grad" in text:
        return ("some model parameters received no gradient in this step, which DDP cannot reduce; set "
                "find_unused_parameters = true (--find-unused-parameters) or remove the unused parameters "
                "from the model")
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered or "connection closed by peer" in lowered:
        me = str(int(os.environ.get("RANK", "0")))
        # This rank timed out waiting, so it is not the one that stopped: of the others, the one with the
        # fewest completed steps, then forward passes, then the oldest last step.
        peers = {r: p for r, p in progress_by_rank(os.environ.get(METRICS_DIR_ENV)).items() if r != me}
        culprit = ""
        if peers:
            rank, (steps, forwards, last) = min(peers.items(), key=lambda item: item[1])
            culprit = (f"; rank {rank} stopped first (last step {int(steps)}, {time.time() - last:.0f} s ago): "
                       "it is hung or died, see its log")
        return (f"a collective waited longer than --collective-timeout {config.collective_timeout:g} s for a "
                f"peer rank{culprit}")
    return None
