"""A rank's series in its prometheus_client multiprocess files, built from the catalog (trainstack/catalog.py), and
the one read of every rank's progress from those files."""

from __future__ import annotations

import threading
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from trainstack import catalog
from trainstack.telemetry.device import RankIdentity

if TYPE_CHECKING:  # imported for real only once the multiprocess directory is set (catalog.rank_metric)
    from prometheus_client import Counter, Gauge

# training_state_bytes keys (also its record keys) -> the gauge each is exported as.
STATE_BYTES = {
    "param_bytes": catalog.TRAIN_PARAM_BYTES,
    "grad_bytes": catalog.TRAIN_GRAD_BYTES,
    "optimizer_state_bytes": catalog.TRAIN_OPTIMIZER_STATE_BYTES,
}


class CountedSeries:
    """A counter the hang watch and a rank that timed out compare (steps, forward passes:
    metric_files.progress_by_rank), counted in the rank's memory and written by `publish`, which any of the rank's
    threads may call: its loop, as it publishes its held series, and the hang responder's thread at each poll
    (trainstack/hang.py), so that a rank stopped anywhere that releases the GIL (a collective, its loader) shows
    within a poll where it stopped. Only the loop's thread counts: the count has one writer, and `publish` writes
    what was counted since it last wrote, under a lock of its own."""

    __slots__ = ("_series", "count", "_published", "_lock")

    def __init__(self, series: Any):  # a Counter
        self._series = series
        self.count = 0
        self._published = 0
        self._lock = threading.Lock()

    def inc(self, amount: int = 1) -> None:
        self.count += amount

    def publish(self) -> None:
        with self._lock:
            count = self.count
            if count != self._published:
                self._series.inc(count - self._published)
                self._published = count


class _NoSeries:
    """A series of a rank without a metrics directory (PROMETHEUS_MULTIPROC_DIR): every update does nothing, so
    the telemetry publishes the same way with or without one."""

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def labels(self, *labels: str) -> _NoSeries:
        return self

    def publish(self) -> None:
        pass


NO_SERIES = _NoSeries()


class HeldSeries:
    """A series a rank updates every step or every record, held in the rank's memory and written to its file by
    `publish` (at least once a second of steps, before a pause and at the end: trainstack/monitor.py): a write to
    the memory-mapped file takes a lock, a system call and a few Python calls, which with the caches cold after a
    step's compute cost some 20 us each (docs/benchmarks.md). Only the loop's thread may use it."""

    __slots__ = ("_series", "_amount", "_value", "_observed")

    def __init__(self, series: Any):  # a Counter, a Gauge or a Histogram
        self._series = series
        self._amount = 0.0
        self._value: float | None = None
        self._observed: list[float] = []

    def inc(self, amount: float = 1) -> None:
        self._amount += amount

    def set(self, value: float) -> None:
        self._value = value

    def observe(self, value: float) -> None:
        self._observed.append(value)

    def publish(self) -> None:
        if self._amount:
            amount, self._amount = self._amount, 0.0
            self._series.inc(amount)
        if self._value is not None:
            value, self._value = self._value, None
            self._series.set(value)
        if self._observed:
            observed, self._observed = self._observed, []
            for value in observed:
                self._series.observe(value)


def _off(cls):
    """`cls` with every series it must have a no-op one, and the optional ones (None) absent."""
    required = {
        item.name: NO_SERIES
        for item in fields(cls)
        if item.default is MISSING and item.default_factory is MISSING and item.init
    }
    return cls(
        **required | ({"state_bytes": dict.fromkeys(STATE_BYTES, NO_SERIES)} if "state_bytes" in required else {})
    )


@dataclass(frozen=True)
class RankMetrics:
    """A rank's series in its multiprocess files, built from the catalog (trainstack/catalog.py): those its steps and
    records update held (HeldSeries, CountedSeries), the rest written as they change."""

    steps: CountedSeries
    samples: HeldSeries
    tokens: HeldSeries
    forward_passes: CountedSeries
    forward_seconds: HeldSeries
    data_wait: HeldSeries
    host_data_wait: HeldSeries
    step_duration: HeldSeries
    loss: HeldSeries
    learning_rate: HeldSeries
    last_step: HeldSeries
    epoch: HeldSeries
    last_checkpoint: Gauge
    checkpoint_duration: Gauge
    compile_seconds: Counter
    recompiles: Counter
    time: Counter
    """The time-by-part counter, unlabelled: `time_of(part)` is a part's (trainstack/breakdown.py's parts)."""
    state_bytes: dict[str, Gauge]
    """training_state_bytes key -> its gauge."""
    memory_allocated_peak: HeldSeries | None = None
    """None off CUDA, as the next one."""
    memory_reserved_peak: HeldSeries | None = None
    mfu: HeldSeries | None = None
    """None where the device's peak FLOP/s is unknown."""
    rank: str = ""
    _time_parts: dict[str, HeldSeries] = field(default_factory=dict, init=False)
    """part -> its held series: `labels` takes a lock and a lookup."""

    @classmethod
    def off(cls) -> RankMetrics:
        return _off(cls)

    def time_of(self, part: str) -> HeldSeries:
        """The series of the rank's time in `part`; asked first, it is in the rank's file from then on (a rate
        needs two samples)."""
        held = self._time_parts.get(part)
        if held is None:
            held = self._time_parts[part] = HeldSeries(self.time.labels(self.rank, part))
        return held

    def publish(self) -> None:
        """Writes the held and counted series' updates to the rank's file."""
        for held in (
            self.steps,
            self.forward_passes,
            self.samples,
            self.tokens,
            self.forward_seconds,
            self.data_wait,
            self.host_data_wait,
            self.step_duration,
            self.loss,
            self.learning_rate,
            self.last_step,
            self.epoch,
            self.memory_allocated_peak,
            self.memory_reserved_peak,
            self.mfu,
            *self._time_parts.values(),
        ):
            if held is not None:
                held.publish()

    def publish_progress(self) -> None:
        """The counted series alone: the hang responder's thread's share of `publish`."""
        self.steps.publish()
        self.forward_passes.publish()

    @classmethod
    def build(cls, identity: RankIdentity, clock: str, on_cuda: bool, knows_peak: bool) -> RankMetrics:
        rank = str(identity.rank)

        def series(metric: catalog.Metric):
            return catalog.rank_metric(metric).labels(rank)

        def held(metric: catalog.Metric) -> HeldSeries:
            return HeldSeries(series(metric))

        metrics = cls(
            steps=CountedSeries(series(catalog.TRAIN_STEPS)),
            samples=held(catalog.TRAIN_SAMPLES),
            tokens=held(catalog.TRAIN_TOKENS),
            forward_passes=CountedSeries(series(catalog.TRAIN_FORWARD_PASSES)),
            forward_seconds=held(catalog.TRAIN_FORWARD_SECONDS),
            data_wait=held(catalog.TRAIN_DATA_WAIT),
            host_data_wait=held(catalog.TRAIN_HOST_DATA_WAIT),
            step_duration=held(catalog.TRAIN_STEP_DURATION),
            loss=held(catalog.TRAIN_LOSS),
            learning_rate=held(catalog.TRAIN_LEARNING_RATE),
            last_step=held(catalog.TRAIN_LAST_STEP),
            epoch=held(catalog.TRAIN_EPOCH),
            last_checkpoint=series(catalog.TRAIN_LAST_CHECKPOINT),
            checkpoint_duration=series(catalog.TRAIN_CHECKPOINT_DURATION),
            compile_seconds=series(catalog.TRAIN_COMPILE_SECONDS),
            recompiles=series(catalog.TRAIN_RECOMPILES),
            time=catalog.rank_metric(catalog.TRAIN_TIME),
            memory_allocated_peak=held(catalog.TRAIN_MEMORY_ALLOCATED_PEAK) if on_cuda else None,
            memory_reserved_peak=held(catalog.TRAIN_MEMORY_RESERVED_PEAK) if on_cuda else None,
            mfu=held(catalog.TRAIN_MFU) if knows_peak else None,
            state_bytes={key: series(metric) for key, metric in STATE_BYTES.items()},
            rank=rank,
        )
        catalog.rank_metric(catalog.TRAIN_RANK_INFO).labels(
            rank=rank, local_rank=str(identity.local_rank), node=identity.node, uuid=identity.uuid
        ).set(1)
        catalog.rank_metric(catalog.TRAIN_RUN_INFO).labels(
            rank=rank,
            run_id=identity.run_id,
            world_size=str(identity.world_size),
            nodes=str(identity.nodes),
            mixed_precision=identity.mixed_precision,
            model=identity.model,
            dataset=identity.dataset,
            clock=clock,
            strategy=identity.strategy,
            launcher=identity.launcher,
        ).set(1)
        return metrics


@dataclass(frozen=True)
class CommMetrics:
    """A DDP or FSDP rank's communication series (trainstack/telemetry/comm.py), held as its records update them; a
    rank alone has none."""

    seconds: HeldSeries
    exposed: HeldSeries
    bytes: HeldSeries

    @classmethod
    def off(cls) -> CommMetrics:
        return _off(cls)

    @classmethod
    def build(cls, identity: RankIdentity) -> CommMetrics:
        rank = str(identity.rank)
        return cls(
            *(
                HeldSeries(catalog.rank_metric(metric).labels(rank))
                for metric in (catalog.TRAIN_COMM_SECONDS, catalog.TRAIN_COMM_EXPOSED, catalog.TRAIN_COMM_BYTES)
            )
        )

    def publish(self) -> None:
        for held in (self.seconds, self.exposed, self.bytes):
            held.publish()
