"""What diagnose knows about a run at one moment: per rank and per GPU figures, read from a Source."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from trainstack import catalog
from trainstack.monitoring.diagnose.sources import GPU_SAMPLE_AGE, GPU_SAMPLE_INTERVAL, Sample, Source

THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class RankView:
    rank: str
    uuid: str = ""
    node: str = ""
    steps: float = 0.0
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    data_wait_ratio: float | None = None
    """Share of step time the rank's device idled for want of a batch (catalog.RANK_DATA_WAIT_RATIO):
    on a GPU rank measured on the GPU's timeline, on a CPU rank the host's time blocked in the loader."""
    host_data_wait_ratio: float | None = None
    """Share of step time the host spent blocked in the loader's next(); the same as data_wait_ratio on CPU."""
    clock: str = "host"
    """Where the rank measures step, forward and data-wait times: gpu or host (catalog.TRAIN_RUN_INFO)."""
    step_seconds: float | None = None
    """Mean wall time per optimizer step over the window; the same on every DDP rank."""
    forward_seconds: float | None = None
    """Mean forward-pass time per step: the rank's own speed, before any collective."""
    last_step_time: float | None = None
    mfu: float | None = None


@dataclass(frozen=True)
class GpuView:
    index: str
    uuid: str
    name: str = ""
    utilization: float | None = None
    memory_used_ratio: float | None = None
    thermal_throttle_ratio: float | None = None
    power_throttle_ratio: float | None = None
    sm_clock_ratio: float | None = None
    """Current SM clock over its maximum."""


@dataclass(frozen=True)
class Snapshot:
    source: str
    now: float
    ranks: list[RankView] = field(default_factory=list)
    gpus: list[GpuView] = field(default_factory=list)
    gpu_sample_ages: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Exporter instance and cadence ("node0:9450 fast") -> (age of its GPU sample, its sampling interval), s."""

    def straggler_ratios(self) -> dict[str, float]:
        """Each rank's forward time per step over the ranks' median (catalog.RANK_STRAGGLER_RATIO).
        Forward time, not step time: in DDP the fast ranks wait for the slow one inside the gradient all-reduce,
        so every rank's step takes the same time. Empty when the ranks do not export forward time."""
        speeds = {r.rank: r.forward_seconds for r in self.ranks if r.forward_seconds is not None}
        if len(speeds) < 2 or not statistics.median(speeds.values()) > 0:
            return {}
        median = statistics.median(speeds.values())
        return {rank: speed / median for rank, speed in speeds.items()}


def _by(label: str, samples: list[Sample]) -> dict[str, float]:
    return {labels[label]: value for labels, value in samples if label in labels}


def _labels_by_rank(samples: list[Sample]) -> dict[str, dict[str, str]]:
    return {labels["rank"]: labels for labels, _ in samples if "rank" in labels}


def _ratio(numerators: dict[str, float], denominators: dict[str, float]) -> dict[str, float]:
    return {key: value / denominators[key] for key, value in numerators.items() if denominators.get(key)}


def read_snapshot(source: Source) -> Snapshot:
    return Snapshot(source.description, source.now, _ranks(source), _gpus(source), _gpu_sample_ages(source))


def _gpu_sample_ages(source: Source) -> dict[str, tuple[float, float]]:
    def key(labels: dict[str, str]) -> str:
        return " ".join(filter(None, (labels.get("instance"), labels.get("cadence"))))

    intervals = {key(labels): value for labels, value in source.instant(GPU_SAMPLE_INTERVAL)}
    return {key(labels): (age, intervals[key(labels)]) for labels, age in source.instant(GPU_SAMPLE_AGE)
            if key(labels) in intervals}


def _ranks(source: Source) -> list[RankView]:
    info = _labels_by_rank(source.instant(catalog.TRAIN_RANK_INFO.name))
    clocks = {rank: labels["clock"] for rank, labels in
              _labels_by_rank(source.instant(catalog.TRAIN_RUN_INFO.name)).items() if labels.get("clock")}
    steps = _by("rank", source.instant(catalog.TRAIN_STEPS.name))
    step_rate = _by("rank", source.rate(catalog.TRAIN_STEPS.name))
    samples_rate = _by("rank", source.rate(catalog.TRAIN_SAMPLES.name))
    step_time_rate = _by("rank", source.rate(catalog.TRAIN_STEP_DURATION.sample("sum")))
    step_seconds = _ratio(step_time_rate, _by("rank", source.rate(catalog.TRAIN_STEP_DURATION.sample("count"))))
    # As the recording rule: the share of step time spent waiting for the batch, a ratio of two rates so that a
    # run younger than the window reads true. A wait is counted when it ends, so a window can catch a little
    # more of it than of the step: cap at 1.
    wait = {name: min(1.0, ratio)
            for name, ratio in _ratio(_by("rank", source.rate(catalog.TRAIN_DATA_WAIT.name)),
                                      step_time_rate).items()}
    host_wait = {name: min(1.0, ratio)
                 for name, ratio in _ratio(_by("rank", source.rate(catalog.TRAIN_HOST_DATA_WAIT.name)),
                                           step_time_rate).items()}
    forward = _ratio(_by("rank", source.rate(catalog.TRAIN_FORWARD_SECONDS.name)), step_rate)
    last = _by("rank", source.instant(catalog.TRAIN_LAST_STEP.name))
    mfu = _by("rank", source.instant(catalog.TRAIN_MFU.name))
    views = []
    for rank in sorted(set(info) | set(steps), key=lambda r: int(r) if r.isdigit() else r):
        labels = info.get(rank, {})
        views.append(RankView(
            rank=rank, uuid=labels.get("uuid", ""), node=labels.get("node", ""), steps=steps.get(rank, 0.0),
            steps_per_second=step_rate.get(rank), samples_per_second=samples_rate.get(rank),
            data_wait_ratio=wait.get(rank), host_data_wait_ratio=host_wait.get(rank),
            clock=clocks.get(rank, "host"), step_seconds=step_seconds.get(rank),
            forward_seconds=forward.get(rank), last_step_time=last.get(rank) or None, mfu=mfu.get(rank),
        ))
    return views


def _active_reasons(source: Source) -> dict[str, set[str]]:
    active: dict[str, set[str]] = {}
    for labels, value in source.instant(catalog.GPU_CLOCK_EVENT_ACTIVE.name):
        if "uuid" in labels:
            reasons = active.setdefault(labels["uuid"], set())
            if value:
                reasons.add(labels.get("reason", ""))
    return active


def _throttle(rates: dict[str, float], active: dict[str, set[str]], uuid: str, reasons: tuple[str, ...]):
    """The violation counter's rate; else 1 or 0 from whether a matching reason is active now; else unknown."""
    if uuid in rates:
        return rates[uuid]
    if uuid in active:
        return float(bool(active[uuid] & set(reasons)))
    return None


def _gpus(source: Source) -> list[GpuView]:
    info = {labels["uuid"]: labels for labels, _ in source.instant(catalog.GPU_INFO.name) if "uuid" in labels}
    utilization = _by("uuid", source.instant(catalog.GPU_UTILIZATION.name))
    memory = _ratio(_by("uuid", source.instant(catalog.GPU_MEMORY_USED.name)),
                    _by("uuid", source.instant(catalog.GPU_MEMORY_TOTAL.name)))
    thermal = _by("uuid", source.rate(catalog.GPU_THERMAL_VIOLATION.name))
    power = _by("uuid", source.rate(catalog.GPU_POWER_VIOLATION.name))
    clock = _ratio(_by("uuid", source.instant(catalog.GPU_SM_CLOCK.name)),
                   _by("uuid", source.instant(catalog.GPU_SM_CLOCK_MAX.name)))
    # GPUs without violation counters: whether a throttle reason holds the clocks down right now.
    active = _active_reasons(source)
    views = []
    for uuid, labels in sorted(info.items(), key=lambda item: int(item[1].get("gpu", "0"))):
        views.append(GpuView(
            index=labels.get("gpu", "?"), uuid=uuid, name=labels.get("name", ""),
            utilization=utilization.get(uuid), memory_used_ratio=memory.get(uuid),
            thermal_throttle_ratio=_throttle(thermal, active, uuid, THERMAL_REASONS),
            power_throttle_ratio=_throttle(power, active, uuid, POWER_REASONS),
            sm_clock_ratio=clock.get(uuid),
        ))
    return views
