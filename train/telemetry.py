"""Per-rank telemetry: prometheus_client multiprocess files for the exporter, JSON lines for the run report.

Nothing here talks to another rank or waits on one: each rank writes its own memory-mapped files (a few
microseconds per step) and appends one JSON line per log interval. The loss it publishes is the cross-rank mean
that the training loop already reduced.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from train.timeline import DeviceTimeline
from trainstack.rundir import METRICS_DIR_ENV, SEGMENT_MARKER, RunDir

# training_state_bytes keys -> what they count; each is the gauge trainstack_train_<key>.
STATE_BYTES = {"param_bytes": "parameters", "grad_bytes": "gradients", "optimizer_state_bytes": "optimizer state"}
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# Dense peak FLOP/s by (device name fragment, precision). "no" is fp32 on the CUDA cores (TF32 off); "tf32" is fp32
# matmuls on the tensor cores, what precision "no" runs at with --tf32 (GPUs without TF32 have no entry).
PEAK_FLOPS = {
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "no": 51.2e12},
    "H100": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "no": 66.9e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "no": 19.5e12},
    "L40S": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "no": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "no": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "no": 31.2e12},
    "V100": {"fp16": 125e12, "no": 15.7e12},
    "T4": {"fp16": 65e12, "no": 8.1e12},
}


def peak_flops(device: torch.device, precision: str, tf32: bool = False) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in name:
            return peaks.get("tf32" if precision == "no" and tf32 and "tf32" in peaks else precision)
    return None


def device_uuid(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"  # NVML's spelling, so the two join


@dataclass
class RankIdentity:
    rank: int
    local_rank: int
    node: str
    uuid: str
    run_id: str
    world_size: int
    nodes: int
    mixed_precision: str
    model: str
    dataset: str
    strategy: str = "ddp"


class Telemetry:
    def __init__(self, run_dir: Path, identity: RankIdentity, flops_per_token: float, peak: float | None,
                 device: torch.device):
        self.rank = str(identity.rank)
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.device = device
        # Where step, forward and data-wait times are measured: on a GPU its own timeline (train/timeline.py),
        # since the host's clock there says when work was queued, not when it ran.
        self._timeline = DeviceTimeline(partial(torch.cuda.Event, enable_timing=True)) \
            if device.type == "cuda" else None
        self.clock = "gpu" if self._timeline else "host"
        self._metrics = self._make_metrics(identity) if os.environ.get(METRICS_DIR_ENV) else None
        records = RunDir(run_dir).rank_records(identity.rank)
        records.parent.mkdir(parents=True, exist_ok=True)
        self._records = open_records(records, identity)
        self._interval_start = time.time()
        self._last_step_end = time.perf_counter()
        self._step_seconds: list[float] = []
        self._data_wait = 0.0
        self._host_data_wait = 0.0
        self._wait_start = 0.0
        self._samples = 0
        self._forward_start = 0.0
        self._state_bytes: dict[str, int] = {}

    def _make_metrics(self, identity: RankIdentity) -> dict:
        # Imported here: prometheus_client picks its multiprocess mode from the environment at import time.
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["rank"]

        def gauge(name: str, doc: str):
            return Gauge(name, doc, labels, multiprocess_mode="mostrecent").labels(self.rank)

        metrics = {
            "steps": Counter("trainstack_train_steps", "Optimizer steps completed.", labels).labels(self.rank),
            "samples": Counter("trainstack_train_samples", "Samples consumed.", labels).labels(self.rank),
            "tokens": Counter("trainstack_train_tokens", "Non-padding tokens consumed.", labels).labels(self.rank),
            "forward_passes": Counter("trainstack_train_forward_passes", "Forward passes (micro-batches) completed.",
                                      labels).labels(self.rank),
            "forward": Counter("trainstack_train_forward_seconds", "Time in the forward pass, before any collective.",
                               labels).labels(self.rank),
            "data_wait": Counter("trainstack_train_data_wait_seconds",
                                 "Time the rank's device sat idle for want of the next batch (GPU: on its own "
                                 "timeline; CPU: the host's time in the loader).", labels).labels(self.rank),
            "host_data_wait": Counter("trainstack_train_host_data_wait_seconds",
                                      "Host time blocked in the data loader's next(), on every device.",
                                      labels).labels(self.rank),
            "step_duration": Histogram("trainstack_train_step_duration_seconds",
                                       "Time per optimizer step (a GPU rank's on its GPU's timeline).",
                                       labels, buckets=STEP_BUCKETS).labels(self.rank),
            "loss": gauge("trainstack_train_loss", "Training loss, mean over all ranks, at the last log interval."),
            "lr": gauge("trainstack_train_learning_rate", "Current learning rate."),
            "last_step": gauge("trainstack_train_last_step_timestamp_seconds", "Unix time of the last step."),
            "epoch": gauge("trainstack_train_epoch", "Current epoch (0-based)."),
            "last_checkpoint": gauge("trainstack_train_last_checkpoint_timestamp_seconds",
                                     "Unix time the last checkpoint finished."),
            "checkpoint_duration": gauge("trainstack_train_checkpoint_duration_seconds",
                                         "Duration of the last checkpoint."),
            "compile": Counter("trainstack_train_compile_seconds", "Wall time of the steps that ran torch.compile.",
                               labels).labels(self.rank),
            "recompiles": Counter("trainstack_train_recompiles", "Frames torch.compile compiled again for a new "
                                  "batch shape (or a failed guard) after the first step's.", labels).labels(self.rank),
        }
        if self.device.type == "cuda":
            metrics["allocated"] = gauge("trainstack_train_memory_allocated_peak_bytes",
                                         "Peak accelerator memory allocated.")
            metrics["reserved"] = gauge("trainstack_train_memory_reserved_peak_bytes",
                                        "Peak accelerator memory reserved.")
        if self.peak:
            metrics["mfu"] = gauge("trainstack_train_mfu_ratio", "Model FLOPs utilization.")
        for key, what in STATE_BYTES.items():
            metrics[key] = gauge(f"trainstack_train_{key}", f"Bytes of {what} this rank holds at an optimizer step "
                                 "(its shards under FSDP), where they peak.")
        Gauge("trainstack_train_rank_info", "Joins a rank to its GPU.",
              ["rank", "local_rank", "node", "uuid"], multiprocess_mode="mostrecent").labels(
            self.rank, str(identity.local_rank), identity.node, identity.uuid).set(1)
        Gauge("trainstack_train_run_info", "The run; clock: where step, forward and data-wait times are measured; "
              "strategy: ddp or fsdp.",
              ["rank", "run_id", "world_size", "nodes", "mixed_precision", "model", "dataset", "clock", "strategy"],
              multiprocess_mode="mostrecent").labels(
            self.rank, identity.run_id, str(identity.world_size), str(identity.nodes), identity.mixed_precision,
            identity.model, identity.dataset, self.clock, identity.strategy).set(1)
        return metrics

    def forward_started(self) -> None:
        """Forward time tells a straggler apart: in DDP every rank's step lasts as long as the slowest one's,
        because the others wait in backward's all-reduce, but only the straggler's forward is slow."""
        if self._timeline:
            self._timeline.forward_started()
        else:
            self._forward_start = time.perf_counter()

    def forward_done(self) -> None:
        if self._metrics:
            self._metrics["forward_passes"].inc()
        if self._timeline:
            self._timeline.forward_done()
        elif self._metrics:
            self._metrics["forward"].inc(time.perf_counter() - self._forward_start)

    def data_wait_started(self) -> None:
        """The loop is about to ask the loader for the next batch."""
        self._wait_start = time.perf_counter()
        if self._timeline:
            self._timeline.data_wait_started()

    def data_ready(self) -> None:
        """The loader answered (a batch, now on the device, or the end of the epoch)."""
        seconds = time.perf_counter() - self._wait_start
        self._host_data_wait += seconds
        if self._metrics:
            self._metrics["host_data_wait"].inc(seconds)
        if self._timeline:
            self._timeline.data_ready()
            return
        self._data_wait += seconds
        if self._metrics:
            self._metrics["data_wait"].inc(seconds)

    def step_done(self, samples: int) -> None:
        self._count_step(samples)
        if self._timeline:
            self._timeline.step_done()
            return
        now = time.perf_counter()
        duration = now - self._last_step_end
        self._last_step_end = now
        self._step_seconds.append(duration)
        if self._metrics:
            self._metrics["step_duration"].observe(duration)

    def step_compiled(self, samples: int, seconds: float, recompiles: int) -> None:
        """A step that compiled counts as a step, but its time is compile time, not a step time."""
        self._count_step(samples)
        self.resync_clock()
        if self._metrics:
            self._metrics["compile"].inc(seconds)
            self._metrics["recompiles"].inc(recompiles)

    def _count_step(self, samples: int) -> None:
        self._samples += samples
        if self._metrics:
            self._metrics["steps"].inc()
            self._metrics["samples"].inc(samples)
            self._metrics["last_step"].set(time.time())

    def resync_clock(self) -> None:
        """After a checkpoint or evaluation: that pause is not a step, so it must not count as one."""
        self._last_step_end = time.perf_counter()
        if self._timeline:
            self._timeline.restart_step_clock()

    def _read_timeline(self) -> None:
        """The interval's device times. The loop's loss reduction has just synchronised, so nothing waits."""
        times = self._timeline.read()
        self._data_wait, self._step_seconds = times.data_wait_seconds, times.step_seconds
        if self._metrics:
            self._metrics["data_wait"].inc(times.data_wait_seconds)
            self._metrics["forward"].inc(times.forward_seconds)
            for duration in times.step_seconds:
                self._metrics["step_duration"].observe(duration)

    def interval_done(self, step: int, epoch: int, loss: float, lr: float, tokens: int) -> float:
        """Records the interval; returns its data-wait share of step time (for the progress bar)."""
        now = time.time()
        interval = max(now - self._interval_start, 1e-9)
        if self._timeline:
            self._read_timeline()
        stepped = sum(self._step_seconds) or interval
        record = {
            "time": now, "rank": int(self.rank), "step": step, "epoch": epoch, "loss": loss, "lr": lr,
            "samples": self._samples, "tokens": tokens, "interval_seconds": interval,
            "data_wait_seconds": self._data_wait, "step_seconds": self._step_seconds,
            "host_data_wait_seconds": self._host_data_wait, "clock": self.clock, **self._state_bytes,
        }
        self._records.write(json.dumps(record) + "\n")
        if self._metrics:
            m = self._metrics
            m["tokens"].inc(tokens)
            m["loss"].set(loss)
            m["lr"].set(lr)
            m["epoch"].set(epoch)
            if "allocated" in m:
                m["allocated"].set(torch.cuda.max_memory_allocated(self.device))
                m["reserved"].set(torch.cuda.max_memory_reserved(self.device))
            if "mfu" in m:
                # Tokens this rank trained on over the time its steps took (a checkpoint or evaluation pause
                # in the interval is no step): docs/metrics.md.
                m["mfu"].set(self.flops_per_token * tokens / stepped / self.peak)
        share = min(1.0, self._data_wait / stepped)
        self._interval_start = now
        self._step_seconds = []
        self._data_wait = 0.0
        self._host_data_wait = 0.0
        self._samples = 0
        return share

    def state_measured(self, sizes: dict[str, int]) -> None:
        """The rank's parameter, gradient and optimizer-state bytes (`training_state_bytes`)."""
        self._state_bytes = sizes
        if self._metrics:
            for key, value in sizes.items():
                self._metrics[key].set(value)

    def checkpoint_done(self, duration: float) -> None:
        if self._metrics:
            self._metrics["last_checkpoint"].set(time.time())
            self._metrics["checkpoint_duration"].set(duration)
        self.resync_clock()

    def close(self) -> None:
        self._records.close()


def local_bytes(tensors) -> int:
    """Bytes of the tensors this rank holds: a sharded parameter (a DTensor) counts its local shard only."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def training_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Measured right after an optimizer step: gradients are not yet freed and the optimizer state exists.
    model.parameters() lists a tied weight once, as it is stored once."""
    parameters = list(model.parameters())
    return {
        "param_bytes": local_bytes(parameters),
        "grad_bytes": local_bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer_state_bytes": local_bytes(value for state in optimizer.state.values() for value in state.values()
                                             if isinstance(value, torch.Tensor)),
    }


def open_records(path: Path, identity: RankIdentity):
    """A resumed run appends: its file starts each launch (segment) with a marker line. The marker has no "time"
    key, so readers of records alone skip it; a record cut off by a kill is ended first, never glued to it."""
    records = path.open("a", buffering=1)
    if records.tell():
        with path.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":
                records.write("\n")
    records.write(json.dumps({SEGMENT_MARKER: time.time(), "rank": identity.rank, "run_id": identity.run_id}) + "\n")
    return records


def progress_by_rank(metrics_dir: str | None) -> dict[str, tuple[float, float, float]]:
    """rank -> (steps, forward passes, last step unix time), from every rank's files on this node: how a rank
    that timed out in a collective names the peer that stopped, with no collective of its own."""
    if not metrics_dir or not Path(metrics_dir).is_dir():
        return {}
    from prometheus_client.multiprocess import MultiProcessCollector

    wanted = {"trainstack_train_steps_total": 0, "trainstack_train_forward_passes_total": 1,
              "trainstack_train_last_step_timestamp_seconds": 2}
    progress: dict[str, list[float]] = {}
    for family in MultiProcessCollector(None, metrics_dir).collect():
        for sample in family.samples:
            if sample.name in wanted:
                progress.setdefault(sample.labels["rank"], [0.0, 0.0, 0.0])[wanted[sample.name]] = sample.value
    return {rank: tuple(values) for rank, values in progress.items()}
