"""A rank's series in its prometheus_client multiprocess files, built from the catalog (trainstack/catalog.py), and
the one read of every rank's progress from those files."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
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
    """A series a rank updates every step, held in the rank's memory and written to its file by `publish` (at each
    log interval and at least once a second, trainstack/monitor.py): a write to the memory-mapped file takes a lock
    and a few Python calls, each step's share of the instrumentation's cost. The counts the hang watch and a rank
    that timed out compare (steps, forward passes: metric_files.progress_by_rank) are never held: a rank that stops
    must show where it stopped; the last step's time may lag by the second."""

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
    required = {field.name: NO_SERIES for field in fields(cls) if field.default is MISSING}
    return cls(
        **required | ({"state_bytes": dict.fromkeys(STATE_BYTES, NO_SERIES)} if "state_bytes" in required else {})
    )


@dataclass(frozen=True)
class RankMetrics:
    """A rank's series in its multiprocess files, built from the catalog (trainstack/catalog.py)."""

    steps: Counter
    samples: HeldSeries
    tokens: Counter
    forward_passes: Counter
    forward_seconds: Counter
    data_wait: HeldSeries
    host_data_wait: HeldSeries
    step_duration: HeldSeries
    loss: Gauge
    learning_rate: Gauge
    last_step: HeldSeries
    epoch: Gauge
    last_checkpoint: Gauge
    checkpoint_duration: Gauge
    compile_seconds: Counter
    recompiles: Counter
    time: Counter
    """The time-by-part counter, unlabelled: `time.labels(rank, part)` (trainstack/breakdown.py's parts)."""
    state_bytes: dict[str, Gauge]
    """training_state_bytes key -> its gauge."""
    memory_allocated_peak: Gauge | None = None
    """None off CUDA, as the next one."""
    memory_reserved_peak: Gauge | None = None
    mfu: Gauge | None = None
    """None where the device's peak FLOP/s is unknown."""

    @classmethod
    def off(cls) -> RankMetrics:
        return _off(cls)

    def publish(self) -> None:
        """Writes the held series' updates to the rank's file."""
        for held in (self.samples, self.data_wait, self.host_data_wait, self.step_duration, self.last_step):
            held.publish()

    @classmethod
    def build(cls, identity: RankIdentity, clock: str, on_cuda: bool, knows_peak: bool) -> RankMetrics:
        rank = str(identity.rank)

        def series(metric: catalog.Metric):
            return catalog.rank_metric(metric).labels(rank)

        metrics = cls(
            steps=series(catalog.TRAIN_STEPS),
            samples=HeldSeries(series(catalog.TRAIN_SAMPLES)),
            tokens=series(catalog.TRAIN_TOKENS),
            forward_passes=series(catalog.TRAIN_FORWARD_PASSES),
            forward_seconds=series(catalog.TRAIN_FORWARD_SECONDS),
            data_wait=HeldSeries(series(catalog.TRAIN_DATA_WAIT)),
            host_data_wait=HeldSeries(series(catalog.TRAIN_HOST_DATA_WAIT)),
            step_duration=HeldSeries(series(catalog.TRAIN_STEP_DURATION)),
            loss=series(catalog.TRAIN_LOSS),
            learning_rate=series(catalog.TRAIN_LEARNING_RATE),
            last_step=HeldSeries(series(catalog.TRAIN_LAST_STEP)),
            epoch=series(catalog.TRAIN_EPOCH),
            last_checkpoint=series(catalog.TRAIN_LAST_CHECKPOINT),
            checkpoint_duration=series(catalog.TRAIN_CHECKPOINT_DURATION),
            compile_seconds=series(catalog.TRAIN_COMPILE_SECONDS),
            recompiles=series(catalog.TRAIN_RECOMPILES),
            time=catalog.rank_metric(catalog.TRAIN_TIME),
            memory_allocated_peak=series(catalog.TRAIN_MEMORY_ALLOCATED_PEAK) if on_cuda else None,
            memory_reserved_peak=series(catalog.TRAIN_MEMORY_RESERVED_PEAK) if on_cuda else None,
            mfu=series(catalog.TRAIN_MFU) if knows_peak else None,
            state_bytes={key: series(metric) for key, metric in STATE_BYTES.items()},
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
    """A DDP or FSDP rank's communication series (trainstack/telemetry/comm.py); a rank alone has none."""

    seconds: Counter
    exposed: Counter
    bytes: Counter

    @classmethod
    def off(cls) -> CommMetrics:
        return _off(cls)

    @classmethod
    def build(cls, identity: RankIdentity) -> CommMetrics:
        rank = str(identity.rank)
        return cls(
            *(
                catalog.rank_metric(metric).labels(rank)
                for metric in (catalog.TRAIN_COMM_SECONDS, catalog.TRAIN_COMM_EXPOSED, catalog.TRAIN_COMM_BYTES)
            )
        )
