"""What diagnose knows about a run at one moment: per rank and per GPU figures, read from a Source."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainstack import breakdown, catalog, ratios
from trainstack.hang_verdict import Hang
from trainstack.monitoring.diagnose.sources import GPU_SAMPLE_AGE, GPU_SAMPLE_INTERVAL, Sample, Source


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
    """Mean forward-pass time per step, less its waits for collectives: which part of a straggler's step is slow."""
    last_step_time: float | None = None
    mfu: float | None = None
    comm_exposed_ratio: float | None = None
    """Share of step time the rank waited at the collectives (catalog.TRAIN_COMM_EXPOSED: DDP's gradient all-reduce
    after its backward compute and its buffer broadcast, FSDP's collectives): its wait for the network and for
    slower peers. None where unmeasured (one process, a loop whose monitor was given no DDP or FSDP model)."""
    comm_seconds: float | None = None
    """Gradient communication per step, hidden by backward compute or not."""
    comm_bytes_per_step: float | None = None
    """Gradient bytes the rank all-reduced per step."""
    world_size: int | None = None
    strategy: str = ""
    """How the rank shares its model: ddp, fsdp (catalog.TRAIN_RUN_INFO); "" where it does not say."""
    launcher: str = ""
    """What started the rank: train (`trainstack train`), watch (a user's script), "" where it does not say."""
    backend: str = ""
    """The rank's process-group backend (nccl, gloo); "" where it does not say."""
    nccl_switches: dict[str, str] = field(default_factory=dict)
    """NCCL environment variable -> its value, for each switch set in the rank's environment (not empty, not 0)."""
    shm_bytes: float | None = None
    """Size of the /dev/shm the rank sees."""
    host_bound_ratio: float | None = None
    """Share of step time the rank's GPU idled though neither starved nor waiting on communication
    (trainstack/breakdown.py); None where it is not measured (CPU ranks, a GPU NVML cannot read)."""
    mixed_precision: str = ""
    """The rank's --mixed-precision (no, bf16, fp16); "" where it does not say (catalog.TRAIN_RUN_INFO)."""
    compiled: bool | None = None
    """Whether torch.compile compiled on the rank (its compile time is above 0); None where it does not say."""
    paused_ratio: dict[str, float] = field(default_factory=dict)
    """Pause (trainstack/breakdown.py's PAUSES) -> the share of wall time the rank spent in it. A pause only one rank
    takes (a checkpoint rank 0 alone saves) makes the others wait for it at their next collective."""

    @property
    def samples_per_step(self) -> float | None:
        """Samples the rank takes per optimizer step: its per-GPU batch times its gradient accumulation."""
        if not (self.samples_per_second and self.steps_per_second):
            return None
        return self.samples_per_second / self.steps_per_second

    @property
    def bus_bytes_per_second(self) -> float | None:
        """The bus bandwidth the rank's collectives achieved, NCCL's "busbw" (nccl-tests' PERFORMANCE.md): bytes
        per step over communication time per step, times the share of the data each rank sends and receives, so
        that the figure compares with the link's own speed at any world size: 2(n-1)/n for DDP's ring all-reduce,
        (n-1)/n for FSDP's all-gathers and reduce-scatters (their bytes are counted at full size).
        Communication time runs from the first bucket's launch, so time a bucket waited for backward compute
        counts too: a lower bound on what the link carried."""
        if not (self.comm_bytes_per_step and self.comm_seconds and self.world_size and self.world_size > 1):
            return None
        factor = (1 if self.strategy == "fsdp" else 2) * (self.world_size - 1) / self.world_size
        return self.comm_bytes_per_step / self.comm_seconds * factor


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
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    """The most this GPU and its slot allow."""
    pcie_max_width: int | None = None
    nvlinks_active: int | None = None
    """None on a GPU without NVLink."""
    gpm_supported: bool | None = None
    """Whether the GPU answers GPM (catalog.GPU_GPM_INFO); None where the exporter does not say."""
    gpm_reason: str = ""
    """Why not, where it does not."""
    sm_active: float | None = None
    """GPM's figures (monitoring/exporter/gpm.py): shares of the SMs busy, of warps resident, of time the tensor
    cores ran, of DRAM bandwidth used; None without GPM."""
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    link_bytes_per_second: dict[str, float] = field(default_factory=dict)
    """"pcie transmit", "pcie receive", "nvlink transmit", "nvlink receive" -> bytes/s GPM measured, where it did."""

    @property
    def pcie_below_max(self) -> bool:
        """The PCIe link runs at a lower generation or width than GPU and slot allow (the lower generation of an
        idle GPU saving power is no concern; a busy one's is, as is a narrower link at any time)."""
        return any(
            now is not None and most is not None and now < most
            for now, most in ((self.pcie_generation, self.pcie_max_generation), (self.pcie_width, self.pcie_max_width))
        )


@dataclass(frozen=True)
class GpuProcess:
    """One process on one GPU, as NVML lists it (catalog.GPU_PROCESS_MEMORY_USED): any job's, instrumented or not."""

    instance: str
    """The exporter that saw it (Prometheus' label; "" read from one exporter): a pid names a process on one host."""
    pid: str
    name: str
    """"" where the exporter could not see the process's name."""
    uuid: str
    memory_bytes: float


@dataclass(frozen=True)
class Snapshot:
    source: str
    now: float
    ranks: list[RankView] = field(default_factory=list)
    gpus: list[GpuView] = field(default_factory=list)
    gpu_sample_ages: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Exporter instance and cadence ("node0:9450 fast") -> (age of its GPU sample, its sampling interval), s."""
    processes: list[GpuProcess] = field(default_factory=list)
    command: str = ""
    """The command `trainstack watch` runs (catalog.WATCH_COMMAND_INFO); "" when the source is no watched run."""
    command_processes: int | None = None
    """How many of the watched command's processes run now; None when the source is no watched run."""
    run_ids: frozenset[str] = frozenset()
    """The runs the source serves (the ranks' run info, a watched command's): whose run directory it speaks for."""
    hang: tuple[Hang, float] | None = None
    """The latest stall's hang verdict and the unix time its evidence was collected: served by the exporter beside
    the run (catalog.HANG_EVIDENCE), or read from RUN_DIR/hang with `--run-dir` (trainstack/hang_verdict.py); None
    without a stall."""
    unjudged: dict[str, str] = field(default_factory=dict)
    """Rank -> why it could not be judged, where its records say it ran but give nothing to judge (a finished run's
    records only: a live source lists only the ranks that report)."""

    def gpus_held(self) -> dict[tuple[str, str], list[GpuProcess]]:
        """(instance, pid) -> the GPUs the process holds: those where it uses the most memory of the processes
        there (on a tie, each of them). A process that merely left a CUDA context on a GPU another process fills
        holds nothing there."""
        most: dict[str, float] = {}
        for process in self.processes:
            most[process.uuid] = max(most.get(process.uuid, 0.0), process.memory_bytes)
        held: dict[tuple[str, str], dict[str, GpuProcess]] = {}
        for process in self.processes:
            if process.memory_bytes == most[process.uuid]:
                held.setdefault((process.instance, process.pid), {})[process.uuid] = process
        return {key: list(by_uuid.values()) for key, by_uuid in held.items()}

    def straggler_waits(self) -> dict[str, float]:
        """Per rank, what the most waiting rank waits at the collectives beyond it, as a share of step time
        (ratios.STRAGGLER_WAIT): largest on the straggler. Empty where fewer than two ranks' waits are measured."""
        return ratios.STRAGGLER_WAIT.of(
            {r.rank: r.comm_exposed_ratio for r in self.ranks if r.comm_exposed_ratio is not None},
            {r.rank: r.step_seconds for r in self.ranks if r.step_seconds is not None},
        )


def _by(label: str, samples: list[Sample]) -> dict[str, float]:
    return {labels[label]: value for labels, value in samples if label in labels}


def _labels_by_rank(samples: list[Sample]) -> dict[str, dict[str, str]]:
    return {labels["rank"]: labels for labels, _ in samples if "rank" in labels}


def _ratio_of(source: Source, ratio: ratios.Ratio, label: str) -> dict[str, float]:
    """The ratio per `label` value, from its counters' rates or its gauges' values, where it is defined."""
    read = source.rate if ratio.counters else source.instant
    numerators = _by(label, [(labels, value) for labels, value in read(ratio.numerator) if ratio.counts(labels)])
    denominators = _by(label, read(ratio.denominator))
    return {
        key: value
        for key, numerator in numerators.items()
        if (value := ratio.of(numerator, denominators.get(key, 0.0))) is not None
    }


def served_run_ids(instant: Callable[[str], list[Sample]]) -> frozenset[str]:
    """The runs a source's series speak for (`instant`: its newest value of each series of a name)."""
    infos = instant(catalog.TRAIN_RUN_INFO.name) + instant(catalog.WATCH_COMMAND_INFO.name)
    return frozenset(labels["run_id"] for labels, _ in infos if labels.get("run_id"))


def read_snapshot(source: Source) -> Snapshot:
    running = [value for _, value in source.instant(catalog.WATCH_COMMAND_PROCESSES.name)]
    commands = [labels.get("command", "") for labels, _ in source.instant(catalog.WATCH_COMMAND_INFO.name)]
    return Snapshot(
        source.description,
        source.now,
        _ranks(source),
        _gpus(source),
        _gpu_sample_ages(source),
        _processes(source),
        command=commands[0] if commands else "",
        command_processes=int(sum(running)) if running else None,
        run_ids=served_run_ids(source.instant),
        hang=_hang(source),
    )


def _hang(source: Source) -> tuple[Hang, float] | None:
    """The newest stall verdict the source serves (catalog.HANG_EVIDENCE), as diagnose --run-dir reads it from the
    files; the exporter serves its headline, culprits and fix (the evidence lines stay in RUN_DIR/hang)."""
    served = source.instant(catalog.HANG_EVIDENCE.name)
    if not served:
        return None
    labels, collected_at = max(served, key=lambda sample: sample[1])
    culprits = [int(rank) for rank in labels.get("culprits", "").split(",") if rank.strip().isdigit()]
    return Hang(labels.get("headline", ""), [], labels.get("fix", ""), culprits), collected_at


def _processes(source: Source) -> list[GpuProcess]:
    return [
        GpuProcess(labels.get("instance", ""), labels["pid"], labels.get("process", ""), labels["uuid"], value)
        for labels, value in source.instant(catalog.GPU_PROCESS_MEMORY_USED.name)
        if "pid" in labels and "uuid" in labels
    ]


def _gpu_sample_ages(source: Source) -> dict[str, tuple[float, float]]:
    def key(labels: dict[str, str]) -> str:
        return " ".join(filter(None, (labels.get("instance"), labels.get("cadence"))))

    intervals = {key(labels): value for labels, value in source.instant(GPU_SAMPLE_INTERVAL)}
    return {
        key(labels): (age, intervals[key(labels)])
        for labels, age in source.instant(GPU_SAMPLE_AGE)
        if key(labels) in intervals
    }


def _ranks(source: Source) -> list[RankView]:
    info = _labels_by_rank(source.instant(catalog.TRAIN_RANK_INFO.name))
    run_info = _labels_by_rank(source.instant(catalog.TRAIN_RUN_INFO.name))
    clocks = {rank: labels["clock"] for rank, labels in run_info.items() if labels.get("clock")}
    steps = _by("rank", source.instant(catalog.TRAIN_STEPS.name))
    step_rate = _by("rank", source.rate(catalog.TRAIN_STEPS.name))
    samples_rate = _by("rank", source.rate(catalog.TRAIN_SAMPLES.name))
    step_seconds = _ratio_of(source, ratios.STEP_SECONDS, "rank")
    wait = _ratio_of(source, ratios.DATA_WAIT_SHARE, "rank")
    host_wait = _ratio_of(source, ratios.HOST_DATA_WAIT_SHARE, "rank")
    forward = _ratio_of(source, ratios.FORWARD_SECONDS, "rank")
    comm_exposed = _ratio_of(source, ratios.COMM_EXPOSED_SHARE, "rank")
    comm = _ratio_of(source, ratios.COMM_SECONDS, "rank")
    comm_bytes = _ratio_of(source, ratios.COMM_BYTES_PER_STEP, "rank")
    world_sizes = {
        rank: int(labels["world_size"]) for rank, labels in run_info.items() if labels.get("world_size", "").isdigit()
    }
    comm_setup = _labels_by_rank(source.instant(catalog.TRAIN_COMM_SETUP_INFO.name))
    shm = _by("rank", source.instant(catalog.TRAIN_SHM_BYTES.name))
    host_bound = _ratio_of(source, ratios.HOST_BOUND_SHARE, "rank")
    compile_seconds = _by("rank", source.instant(catalog.TRAIN_COMPILE_SECONDS.name))
    last = _by("rank", source.instant(catalog.TRAIN_LAST_STEP.name))
    mfu = _by("rank", source.instant(catalog.TRAIN_MFU.name))
    paused = _paused_by_rank(source)
    views = []
    for rank in sorted(set(info) | set(steps), key=lambda r: int(r) if r.isdigit() else r):
        labels = info.get(rank, {})
        views.append(
            RankView(
                rank=rank,
                uuid=labels.get("uuid", ""),
                node=labels.get("node", ""),
                steps=steps.get(rank, 0.0),
                steps_per_second=step_rate.get(rank),
                samples_per_second=samples_rate.get(rank),
                data_wait_ratio=wait.get(rank),
                host_data_wait_ratio=host_wait.get(rank),
                clock=clocks.get(rank, "host"),
                step_seconds=step_seconds.get(rank),
                forward_seconds=forward.get(rank),
                last_step_time=last.get(rank) or None,
                mfu=mfu.get(rank),
                comm_exposed_ratio=comm_exposed.get(rank),
                comm_seconds=comm.get(rank),
                host_bound_ratio=host_bound.get(rank),
                comm_bytes_per_step=comm_bytes.get(rank),
                world_size=world_sizes.get(rank),
                strategy=run_info.get(rank, {}).get("strategy", ""),
                launcher=run_info.get(rank, {}).get("launcher", ""),
                backend=comm_setup.get(rank, {}).get("backend", ""),
                nccl_switches=_switches_set(comm_setup.get(rank, {})),
                shm_bytes=shm.get(rank),
                mixed_precision=run_info.get(rank, {}).get("mixed_precision", ""),
                compiled=compile_seconds[rank] > 0 if rank in compile_seconds else None,
                paused_ratio=paused.get(rank, {}),
            )
        )
    return views


def _paused_by_rank(source: Source) -> dict[str, dict[str, float]]:
    """Rank -> pause -> its share of wall time: the rate of the rank's time counter in that part (seconds a
    second)."""
    paused: dict[str, dict[str, float]] = {}
    for labels, rate in source.rate(catalog.TRAIN_TIME.name):
        if labels.get("part") in breakdown.PAUSES and "rank" in labels:
            paused.setdefault(labels["rank"], {})[labels["part"]] = rate
    return paused


def _switches_set(labels: dict[str, str]) -> dict[str, str]:
    """The NCCL switches a rank's setup labels carry, by environment variable, where set (0 switches one off)."""
    return {
        label.upper(): value
        for label in catalog.NCCL_SWITCH_LABELS
        if (value := labels.get(label, "").strip()) not in ("", "0")
    }


def _active_reasons(source: Source) -> dict[str, set[str]]:
    active: dict[str, set[str]] = {}
    for labels, value in source.instant(catalog.GPU_CLOCK_EVENT_ACTIVE.name):
        if "uuid" in labels:
            reasons = active.setdefault(labels["uuid"], set())
            if value:
                reasons.add(labels.get("reason", ""))
    return active


def _gpus(source: Source) -> list[GpuView]:
    info = {labels["uuid"]: labels for labels, _ in source.instant(catalog.GPU_INFO.name) if "uuid" in labels}
    utilization = _by("uuid", source.instant(catalog.GPU_UTILIZATION.name))
    memory = _ratio_of(source, ratios.MEMORY_USED_SHARE, "uuid")
    thermal = _by("uuid", source.rate(ratios.THERMAL_THROTTLE.violation_counter))
    power = _by("uuid", source.rate(ratios.POWER_THROTTLE.violation_counter))
    clock = _ratio_of(source, ratios.SM_CLOCK_SHARE, "uuid")
    # GPUs without violation counters: whether a throttle reason holds the clocks down right now.
    active = _active_reasons(source)
    links = {labels["uuid"]: labels for labels, _ in source.instant(catalog.GPU_LINK_INFO.name) if "uuid" in labels}
    gpm = {labels["uuid"]: labels for labels, _ in source.instant(catalog.GPU_GPM_INFO.name) if "uuid" in labels}
    # GpuView's field -> GPU -> ratio; Any, as GpuView's keyword arguments are read by name from it
    activity: dict[str, dict[str, Any]] = {
        field_name: _by("uuid", source.instant(metric.name))
        for field_name, metric in (
            ("sm_active", catalog.GPU_SM_ACTIVE),
            ("sm_occupancy", catalog.GPU_SM_OCCUPANCY),
            ("tensor_active", catalog.GPU_TENSOR_ACTIVE),
            ("dram_active", catalog.GPU_DRAM_ACTIVE),
        )
    }
    traffic = {
        link: _by("uuid", source.rate(metric.name))
        for link, metric in (
            ("pcie transmit", catalog.GPU_GPM_PCIE_TRANSMIT),
            ("pcie receive", catalog.GPU_GPM_PCIE_RECEIVE),
            ("nvlink transmit", catalog.GPU_GPM_NVLINK_TRANSMIT),
            ("nvlink receive", catalog.GPU_GPM_NVLINK_RECEIVE),
        )
    }
    views = []
    for uuid, labels in sorted(info.items(), key=lambda item: int(item[1].get("gpu", "0"))):
        views.append(
            GpuView(
                index=labels.get("gpu", "?"),
                uuid=uuid,
                name=labels.get("name", ""),
                utilization=utilization.get(uuid),
                memory_used_ratio=memory.get(uuid),
                thermal_throttle_ratio=ratios.THERMAL_THROTTLE.of(thermal.get(uuid), active.get(uuid)),
                power_throttle_ratio=ratios.POWER_THROTTLE.of(power.get(uuid), active.get(uuid)),
                sm_clock_ratio=clock.get(uuid),
                **{
                    label: int(value)
                    for label in catalog.GPU_LINK_LABELS
                    if (value := links.get(uuid, {}).get(label, "")).isdigit()
                },  # "": the driver lacks the call
                gpm_supported={"true": True, "false": False}.get(gpm.get(uuid, {}).get("supported", "")),
                gpm_reason=gpm.get(uuid, {}).get("reason", ""),
                **{field_name: by_uuid.get(uuid) for field_name, by_uuid in activity.items()},
                link_bytes_per_second={link: rates[uuid] for link, rates in traffic.items() if uuid in rates},
            )
        )
    return views
