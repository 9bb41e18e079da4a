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
from pathlib import Path

import torch

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SEGMENT_MARKER = "segment_started"  # the first line each launch appends to a rank's records
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# Dense peak FLOP/s by (device name fragment, precision). "no" is fp32 on the CUDA cores (TF32 off).
PEAK_FLOPS = {
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "no": 66.9e12},
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "no": 66.9e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "no": 51.2e12},
    "H100": {"bf16": 989.4e12, "fp16": 989.4e12, "no": 66.9e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "no": 19.5e12},
    "L40S": {"bf16": 362.05e12, "fp16": 362.05e12, "no": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "no": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "no": 31.2e12},
    "V100": {"fp16": 125e12, "no": 15.7e12},
    "T4": {"fp16": 65e12, "no": 8.1e12},
}


def peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in name:
            return peaks.get(precision)
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


class Telemetry:
    def __init__(self, run_dir: Path, identity: RankIdentity, flops_per_token: float, peak: float | None,
                 device: torch.device):
        self.rank = str(identity.rank)
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.device = device
        self._metrics = self._make_metrics(identity) if os.environ.get(METRICS_DIR_ENV) else None
        telemetry_dir = run_dir / "telemetry"
        telemetry_dir.mkdir(parents=True, exist_ok=True)
        self._records = open_records(telemetry_dir / f"rank-{identity.rank}.jsonl", identity)
        self._interval_start = time.time()
        self._last_step_end = time.perf_counter()
        self._step_seconds: list[float] = []
        self._data_wait = 0.0
        self._samples = 0
        self._forward_start: float | torch.cuda.Event = 0.0
        self._forward_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

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
            "data_wait": Counter("trainstack_train_data_wait_seconds", "Time blocked waiting for the data loader.",
                                 labels).labels(self.rank),
            "step_duration": Histogram("trainstack_train_step_duration_seconds", "Wall time per optimizer step.",
                                       labels, buckets=STEP_BUCKETS).labels(self.rank),
            "loss": gauge("trainstack_train_loss", "Training loss, mean over all ranks, at the last log interval."),
            "lr": gauge("trainstack_train_learning_rate", "Current learning rate."),
            "last_step": gauge("trainstack_train_last_step_timestamp_seconds", "Unix time of the last step."),
            "epoch": gauge("trainstack_train_epoch", "Current epoch (0-based)."),
            "last_checkpoint": gauge("trainstack_train_last_checkpoint_timestamp_seconds",
                                     "Unix time the last checkpoint finished."),
            "checkpoint_duration": gauge("trainstack_train_checkpoint_duration_seconds",
                                         "Duration of the last checkpoint."),
        }
        if self.device.type == "cuda":
            metrics["allocated"] = gauge("trainstack_train_memory_allocated_peak_bytes",
                                         "Peak accelerator memory allocated.")
            metrics["reserved"] = gauge("trainstack_train_memory_reserved_peak_bytes",
                                        "Peak accelerator memory reserved.")
        if self.peak:
            metrics["mfu"] = gauge("trainstack_train_mfu_ratio", "Model FLOPs utilization.")
        Gauge("trainstack_train_rank_info", "Joins a rank to its GPU.",
              ["rank", "local_rank", "node", "uuid"], multiprocess_mode="mostrecent").labels(
            self.rank, str(identity.local_rank), identity.node, identity.uuid).set(1)
        Gauge("trainstack_train_run_info", "The run.",
              ["rank", "run_id", "world_size", "nodes", "mixed_precision", "model", "dataset"],
              multiprocess_mode="mostrecent").labels(
            self.rank, identity.run_id, str(identity.world_size), str(identity.nodes), identity.mixed_precision,
            identity.model, identity.dataset).set(1)
        return metrics

    def forward_started(self) -> None:
        """Forward time tells a straggler apart: in DDP every rank's step lasts as long as the slowest one's,
        because the others wait in backward's all-reduce, but only the straggler's forward is slow. On a GPU
        the host returns before the kernels finish, so CUDA events time it and are read once per interval."""
        if self.device.type == "cuda":
            self._forward_start = torch.cuda.Event(enable_timing=True)
            self._forward_start.record()
        else:
            self._forward_start = time.perf_counter()

    def forward_done(self) -> None:
        if self._metrics:
            self._metrics["forward_passes"].inc()
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._forward_events.append((self._forward_start, end))
        elif self._metrics:
            self._metrics["forward"].inc(time.perf_counter() - self._forward_start)

    def waited_for_data(self, seconds: float) -> None:
        self._data_wait += seconds
        if self._metrics:
            self._metrics["data_wait"].inc(seconds)

    def step_done(self, samples: int) -> None:
        now = time.perf_counter()
        duration = now - self._last_step_end
        self._last_step_end = now
        self._step_seconds.append(duration)
        self._samples += samples
        if self._metrics:
            self._metrics["steps"].inc()
            self._metrics["samples"].inc(samples)
            self._metrics["step_duration"].observe(duration)
            self._metrics["last_step"].set(time.time())

    def resync_clock(self) -> None:
        """After a checkpoint or evaluation: that pause is not a step, so it must not count as one."""
        self._last_step_end = time.perf_counter()

    def interval_done(self, step: int, epoch: int, loss: float, lr: float, tokens: int) -> None:
        now = time.time()
        interval = max(now - self._interval_start, 1e-9)
        record = {
            "time": now, "rank": int(self.rank), "step": step, "epoch": epoch, "loss": loss, "lr": lr,
            "samples": self._samples, "tokens": tokens, "interval_seconds": interval,
            "data_wait_seconds": self._data_wait, "step_seconds": self._step_seconds,
        }
        self._records.write(json.dumps(record) + "\n")
        if self._metrics:
            m = self._metrics
            if self._forward_events:
                self._forward_events[-1][1].synchronize()  # already done: the loss reduction just synchronized
                m["forward"].inc(sum(start.elapsed_time(end) for start, end in self._forward_events) / 1000)
            m["tokens"].inc(tokens)
            m["loss"].set(loss)
            m["lr"].set(lr)
            m["epoch"].set(epoch)
            if "allocated" in m:
                m["allocated"].set(torch.cuda.max_memory_allocated(self.device))
                m["reserved"].set(torch.cuda.max_memory_reserved(self.device))
            if "mfu" in m:
                m["mfu"].set(self.flops_per_token * tokens / interval / self.peak)
        self._interval_start = now
        self._step_seconds = []
        self._data_wait = 0.0
        self._samples = 0
        self._forward_events = []

    def checkpoint_done(self, duration: float) -> None:
        if self._metrics:
            self._metrics["last_checkpoint"].set(time.time())
            self._metrics["checkpoint_duration"].set(duration)
        self.resync_clock()

    def close(self) -> None:
        self._records.close()


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
