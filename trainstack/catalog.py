"""Every metric trainstack exports, as data: the one place a metric name is written in Python.

Each entry says what a metric is (name, type, unit, labels, help), where its value comes from (the ranks'
telemetry, an NVML call or field, the exporter itself) and when it is absent. The producers build their metrics
from these entries (trainstack/telemetry/, the exporter's collectors, the NVML fake's stand-in ranks), the readers
take the names from here, and docs/metrics.md's tables are generated from them (scripts/metrics-docs.py). Who
reads a metric is not written here: monitoring/metric_readers.py finds it in the readers themselves, the generated
rule files and dashboards and diagnose's code. tests/unit/trainstack/test_catalog.py holds the files that cannot
import this module (rules, dashboards) to it, and tests/process/test_catalog.py checks that every entry is produced.
The approach is dcgm-exporter's (etc/default-counters.csv parsed into Counter structs, every collector built from
that one table).
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
INFO = "info"

TELEMETRY = "rank telemetry"  # written by each rank into its multiprocess files (trainstack/telemetry/)
NVML = "nvml"  # read from NVML by the exporter's sampler (monitoring/exporter/sampler.py, nvml.py)
EXPORTER = "exporter"  # the exporter's own health (monitoring/exporter/health.py)
WATCH = "trainstack watch"  # the watched command, kept by watch in its node's metrics directory
HANG = "hang evidence"  # the launcher's evidence of a stall in RUN_DIR/hang, served by the exporter beside the run

PREFIX = "trainstack_"
TRAIN_PREFIX = f"{PREFIX}train_"
GPU_PREFIX = f"{PREFIX}gpu_"
EXPORTER_PREFIX = f"{PREFIX}exporter_"
WATCH_PREFIX = f"{PREFIX}watch_"
HANG_PREFIX = f"{PREFIX}hang_"
PREFIXES = {
    TELEMETRY: TRAIN_PREFIX,
    NVML: GPU_PREFIX,
    EXPORTER: EXPORTER_PREFIX,
    WATCH: WATCH_PREFIX,
    HANG: HANG_PREFIX,
}

RANK_LABELS = ("rank",)
GPU_LABELS = ("gpu", "uuid")
CADENCE_LABELS = ("cadence",)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class Metric:
    name: str
    """The name a query uses: a counter's ends in `_total`, an info metric's in `_info`."""
    type: str
    help: str
    """The HELP line the exporter serves."""
    labels: tuple[str, ...]
    source: str
    """TELEMETRY, NVML or EXPORTER."""
    origin: str
    """Where the value comes from in detail: the NVML call or field, or what the rank or exporter measures."""
    unit: str = ""
    """As docs/metrics.md writes it ("s", "bytes", "0..1"...); empty for a count."""
    values: str = ""
    """"1" for an info-style gauge, "0/1" for a yes/no gauge."""
    absent_when: str = ""
    buckets: tuple[float, ...] = ()
    """A histogram's bucket bounds."""

    @property
    def family_name(self) -> str:
        """The name prometheus_client's constructors take: without a counter's `_total`, an info's `_info`."""
        if self.type == COUNTER:
            return self.name.removesuffix("_total")
        if self.type == INFO:
            return self.name.removesuffix("_info")
        return self.name

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The series names a scrape shows for this metric."""
        if self.type == HISTOGRAM:
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.name,)

    def sample(self, suffix: str) -> str:
        """One of a histogram's series: `sum`, `count` or `bucket`."""
        name = f"{self.name}_{suffix}"
        if name not in self.sample_names:
            raise ValueError(f"{self.name} has no series {name}")
        return name


@dataclass(frozen=True)
class Recorded:
    """A series the recording rules (monitoring/prometheus/rules/recording.yml) make from the metrics."""

    name: str
    help: str


# --- training: written by each rank (trainstack/telemetry/) -----------------------------------------------------

TRAIN_STEPS = Metric(
    "trainstack_train_steps_total",
    COUNTER,
    "Optimizer steps completed.",
    RANK_LABELS,
    TELEMETRY,
    "optimizer steps completed",
)
TRAIN_SAMPLES = Metric(
    "trainstack_train_samples_total",
    COUNTER,
    "Samples consumed.",
    RANK_LABELS,
    TELEMETRY,
    "samples (sequences) consumed",
)
TRAIN_TOKENS = Metric(
    "trainstack_train_tokens_total",
    COUNTER,
    "Non-padding tokens consumed.",
    RANK_LABELS,
    TELEMETRY,
    "non-padding tokens consumed",
)
TRAIN_STEP_DURATION = Metric(
    "trainstack_train_step_duration_seconds",
    HISTOGRAM,
    "Time per optimizer step (a GPU rank's on its GPU's timeline).",
    RANK_LABELS,
    TELEMETRY,
    "time per optimizer step, end of the previous step to the end of this one; on a GPU rank on the GPU's "
    "timeline, observed at each log interval ([which clock](#which-clock-data-wait-on-gpu-and-cpu-ranks))",
    unit="s",
    buckets=STEP_BUCKETS,
)
TRAIN_FORWARD_SECONDS = Metric(
    "trainstack_train_forward_seconds_total",
    COUNTER,
    "Time in the forward pass, less its waits for collectives.",
    RANK_LABELS,
    TELEMETRY,
    "time in the forward pass, less its waits for collectives (DDP's buffer broadcast, FSDP's all-gathers, which "
    "count as exposed communication): which part of a straggler's step is slow; added at each log interval, on a "
    "GPU rank on the GPU's timeline",
    unit="s",
)
TRAIN_FORWARD_PASSES = Metric(
    "trainstack_train_forward_passes_total",
    COUNTER,
    "Forward passes (micro-batches) completed.",
    RANK_LABELS,
    TELEMETRY,
    "forward passes (micro-batches) completed; a rank that timed out names the peer with the fewest",
)
TRAIN_DATA_WAIT = Metric(
    "trainstack_train_data_wait_seconds_total",
    COUNTER,
    "Time the rank's device sat idle for want of the next batch (GPU: on its own timeline; CPU: the host's time "
    "in the loader).",
    RANK_LABELS,
    TELEMETRY,
    "time the rank's device sat idle for want of the next batch: on a GPU rank the GPU's starvation, measured on "
    "its timeline and added at each log interval; on a CPU rank the host's time blocked in the loader "
    "([which clock](#which-clock-data-wait-on-gpu-and-cpu-ranks)). The input-bound alert and `trainstack "
    "diagnose` read this one",
    unit="s",
)
TRAIN_HOST_DATA_WAIT = Metric(
    "trainstack_train_host_data_wait_seconds_total",
    COUNTER,
    "Host time blocked in the data loader's next(), on every device.",
    RANK_LABELS,
    TELEMETRY,
    "the host's time blocked in the loader's `next()`, on every device (equal to the data wait on a CPU rank)",
    unit="s",
)
_COMM_ABSENT = "the rank communicates with no other: one process (DDP or FSDP) on its own"
TRAIN_COMM_SECONDS = Metric(
    "trainstack_train_comm_seconds_total",
    COUNTER,
    "Training communication time per step: while at least one collective was in flight.",
    RANK_LABELS,
    TELEMETRY,
    "each step's time with at least one collective in flight: DDP's gradient all-reduces, FSDP's parameter "
    "all-gathers and gradient reduce-scatters, much of it overlapped with compute (trainstack.telemetry.comm); "
    "on a GPU rank on the GPU's timeline; added at each log interval",
    unit="s",
    absent_when=_COMM_ABSENT,
)
TRAIN_COMM_EXPOSED = Metric(
    "trainstack_train_comm_exposed_seconds_total",
    COUNTER,
    "Communication time compute did not hide: the rank waited for the network or its peers.",
    RANK_LABELS,
    TELEMETRY,
    "the part of the communication that compute did not hide, the rank's wait for the network or for slower peers: "
    "DDP from the end of backward compute (the last bucket's launch) to the end of the last bucket's all-reduce, "
    "and its buffer broadcast at the start of each forward pass (`broadcast_buffers`, a model with buffers); FSDP "
    "wherever compute waits for an all-gather or reduce-scatter; on a CPU rank FSDP's collectives hold the host, "
    "so all of them; and every blocking collective the loop or its framework calls (a metric's all-reduce, "
    "Lightning's stop-flag broadcast, the Hugging Face Trainer's label-count gather)",
    unit="s",
    absent_when=_COMM_ABSENT,
)
TRAIN_COMM_BYTES = Metric(
    "trainstack_train_comm_bytes_total",
    COUNTER,
    "Bytes of the rank's collectives, at their full size.",
    RANK_LABELS,
    TELEMETRY,
    "the collectives' sizes: DDP's gradient buckets; FSDP's all-gathers (the gathered parameters) and "
    "reduce-scatters (the gradients before scattering); per step: its rate over the steps' rate",
    unit="bytes",
    absent_when=_COMM_ABSENT,
)
# The NCCL switches a rank publishes, as labels: each is the environment variable's name in lower case.
NCCL_SWITCH_LABELS = ("nccl_p2p_disable", "nccl_shm_disable", "nccl_ib_disable", "nccl_socket_ifname")
TRAIN_COMM_SETUP_INFO = Metric(
    "trainstack_train_comm_setup_info",
    GAUGE,
    "How the rank's gradient communication is set up: its process group's backend and the NCCL switches.",
    ("rank", "backend", *NCCL_SWITCH_LABELS),
    TELEMETRY,
    "the rank's process-group backend (`nccl`, `gloo`) and the value of each NCCL switch in its environment "
    "(`NCCL_P2P_DISABLE`, `NCCL_SHM_DISABLE`, `NCCL_IB_DISABLE`, `NCCL_SOCKET_IFNAME`; empty where unset), "
    "written once, when the rank starts timing its DDP all-reduce (trainstack.telemetry.comm_setup)",
    values="1",
    absent_when=_COMM_ABSENT,
)
TRAIN_SHM_BYTES = Metric(
    "trainstack_train_shm_bytes",
    GAUGE,
    "Size of /dev/shm where the rank runs.",
    RANK_LABELS,
    TELEMETRY,
    "size of the `/dev/shm` file system the rank sees (`os.statvfs`), which NCCL's shared-memory transport between "
    "the ranks of a node uses: a container's default 64 MiB makes it fall back to slower paths; written once, "
    "with the communication setup",
    unit="bytes",
    absent_when=f"{_COMM_ABSENT}; or the rank sees no /dev/shm",
)
TRAIN_TIME = Metric(
    "trainstack_train_time_seconds_total",
    COUNTER,
    "Where the rank's time went, by part: compute, comm_exposed, data_starvation, host_bound, evaluation, "
    "checkpoint_save, checkpoint_load, compile, startup.",
    ("rank", "part"),
    TELEMETRY,
    "the rank's time by `part` ([where each rank's time goes](#where-each-ranks-time-goes)): the steps' parts added "
    "at each log interval, a pause's time when it ends, startup's at the first step. `host_bound` only on GPU ranks "
    "NVML answers for, `comm_exposed` only on ranks that communicate (DDP, FSDP, a timed collective)",
    unit="s",
)
TRAIN_LOSS = Metric(
    "trainstack_train_loss",
    GAUGE,
    "The rank's own training loss, its mean over the last log interval.",
    RANK_LABELS,
    TELEMETRY,
    "the rank's own training loss, its mean over the last log interval",
    absent_when="before the first log interval",
)
TRAIN_LEARNING_RATE = Metric(
    "trainstack_train_learning_rate",
    GAUGE,
    "Current learning rate.",
    RANK_LABELS,
    TELEMETRY,
    "current learning rate",
    absent_when="before the first log interval",
)
TRAIN_LAST_STEP = Metric(
    "trainstack_train_last_step_timestamp_seconds",
    GAUGE,
    "Unix time of the last step.",
    RANK_LABELS,
    TELEMETRY,
    "when the last step completed",
    unit="s (unix)",
    absent_when="before the first step",
)
TRAIN_EPOCH = Metric(
    "trainstack_train_epoch", GAUGE, "Current epoch (0-based).", RANK_LABELS, TELEMETRY, "current epoch (0-based)"
)
TRAIN_LAST_CHECKPOINT = Metric(
    "trainstack_train_last_checkpoint_timestamp_seconds",
    GAUGE,
    "Unix time the last checkpoint finished.",
    RANK_LABELS,
    TELEMETRY,
    "when the last checkpoint finished",
    unit="s (unix)",
    absent_when="before the first checkpoint",
)
TRAIN_CHECKPOINT_DURATION = Metric(
    "trainstack_train_checkpoint_duration_seconds",
    GAUGE,
    "Duration of the last checkpoint.",
    RANK_LABELS,
    TELEMETRY,
    "how long the last checkpoint took",
    unit="s",
    absent_when="before the first checkpoint",
)
TRAIN_COMPILE_SECONDS = Metric(
    "trainstack_train_compile_seconds_total",
    COUNTER,
    "Wall time of the steps that ran torch.compile.",
    RANK_LABELS,
    TELEMETRY,
    "wall time of the steps during which `torch.compile` compiled (left out of the step durations)",
    unit="s",
)
TRAIN_RECOMPILES = Metric(
    "trainstack_train_recompiles_total",
    COUNTER,
    "Frames torch.compile compiled again for a new batch shape (or a failed guard) after the first step's.",
    RANK_LABELS,
    TELEMETRY,
    "frames compiled again after the first step's: each new batch shape (at most one per length bucket) or a "
    "failed guard",
)
TRAIN_MEMORY_ALLOCATED_PEAK = Metric(
    "trainstack_train_memory_allocated_peak_bytes",
    GAUGE,
    "Peak accelerator memory allocated.",
    RANK_LABELS,
    TELEMETRY,
    "peak accelerator memory allocated",
    unit="bytes",
    absent_when="on CPU",
)
TRAIN_MEMORY_RESERVED_PEAK = Metric(
    "trainstack_train_memory_reserved_peak_bytes",
    GAUGE,
    "Peak accelerator memory reserved.",
    RANK_LABELS,
    TELEMETRY,
    "peak accelerator memory reserved",
    unit="bytes",
    absent_when="on CPU",
)
TRAIN_PARAM_BYTES = Metric(
    "trainstack_train_param_bytes",
    GAUGE,
    "Bytes of parameters this rank holds at an optimizer step (its shards under FSDP), where they peak.",
    RANK_LABELS,
    TELEMETRY,
    "bytes of parameters this rank holds (its shards under `--strategy fsdp`; a tied weight once), measured at "
    "the first optimizer step",
    unit="bytes",
    absent_when="before the first optimizer step",
)
TRAIN_GRAD_BYTES = Metric(
    "trainstack_train_grad_bytes",
    GAUGE,
    "Bytes of gradients this rank holds at an optimizer step (its shards under FSDP), where they peak.",
    RANK_LABELS,
    TELEMETRY,
    "bytes of gradients this rank holds at an optimizer step, where they peak",
    unit="bytes",
    absent_when="before the first optimizer step",
)
TRAIN_OPTIMIZER_STATE_BYTES = Metric(
    "trainstack_train_optimizer_state_bytes",
    GAUGE,
    "Bytes of optimizer state this rank holds at an optimizer step (its shards under FSDP), where they peak.",
    RANK_LABELS,
    TELEMETRY,
    "bytes of optimizer state (AdamW: two moments and a step count per parameter) this rank holds",
    unit="bytes",
    absent_when="before the first optimizer step",
)
TRAIN_MFU = Metric(
    "trainstack_train_mfu_ratio",
    GAUGE,
    "Model FLOPs utilization.",
    RANK_LABELS,
    TELEMETRY,
    "model FLOPs utilization over the last log interval ([formula and peaks](#mfu))",
    unit="0..1",
    absent_when="the device peak is unknown (e.g. CPU)",
)
TRAIN_RANK_INFO = Metric(
    "trainstack_train_rank_info",
    GAUGE,
    "Joins a rank to its GPU.",
    ("rank", "local_rank", "node", "uuid"),
    TELEMETRY,
    "joins a rank to its GPU (`uuid` empty on CPU)",
    values="1",
)
TRAIN_RUN_INFO = Metric(
    "trainstack_train_run_info",
    GAUGE,
    "The run; clock: where step, forward and data-wait times are measured; strategy: ddp or fsdp; launcher: "
    "train or watch.",
    ("rank", "run_id", "world_size", "nodes", "mixed_precision", "model", "dataset", "clock", "strategy", "launcher"),
    TELEMETRY,
    "the run; `clock` is where the rank measures step, forward and data-wait times: `gpu` (its GPU's timeline) "
    "or `host`; `strategy`: `ddp` or `fsdp`; `launcher`: `train` (`trainstack train`) or `watch` (a user's "
    "script under `trainstack watch`), empty when unknown: whose knobs a verdict's fix names",
    values="1",
)

# --- the watched command: written by `trainstack watch` (commands/watch.py) -----------------------------------

WATCH_COMMAND_PROCESSES = Metric(
    "trainstack_watch_command_processes",
    GAUGE,
    "Processes of the watched command running now: the command and every process it started.",
    (),
    WATCH,
    "the command and its descendants still running, counted in watch's poll loop; 0 once the command has ended",
    absent_when="the run is not a `trainstack watch` run",
)
WATCH_COMMAND_INFO = Metric(
    "trainstack_watch_command_info",
    GAUGE,
    "The command trainstack watch runs.",
    ("command", "run_id"),
    WATCH,
    "the watched command line (as a shell would quote it) and the run id",
    values="1",
    absent_when="the run is not a `trainstack watch` run",
)

# --- a stall's evidence: the launcher's, in RUN_DIR/hang, served by the exporter (monitoring/exporter/hang.py) ---

HANG_EVIDENCE = Metric(
    "trainstack_hang_evidence_timestamp_seconds",
    GAUGE,
    "When the latest stall's evidence was collected into RUN_DIR/hang: where each rank waits (headline), the ranks "
    "it names (culprits) and the fix the evidence points to.",
    ("headline", "culprits", "fix"),
    HANG,
    "unix time the launcher (`trainstack train` or `watch`) collected the latest stall's evidence, once no rank had "
    "stepped for 20 median steps, or made its first step in 300 s, or trainstack's ranks had stayed in their "
    'start-up for half the collective timeout (docs/diagnostics.md, "When a run hangs"); `headline` names the rank '
    "and the collective or frame it waits in, `culprits` the ranks named (comma-separated), `fix` what the evidence "
    "points to. Evidence newer than the last step (or with no step yet) is a stall now; older is a stall the run came "
    "out of",
    unit="s",
    absent_when="the exporter has no run directory (`--run-dir`), or no stall of this launch has been collected in "
    "it (an earlier launch's stays in RUN_DIR/hang, and the report shows it)",
)

# --- GPUs: read from NVML by the exporter (monitoring/exporter/gpu.py) ---------------------------------------

GPU_INFO = Metric(
    "trainstack_gpu_info",
    INFO,
    "The GPU: model name, PCI bus id and driver version.",
    (*GPU_LABELS, "name", "pci_bus_id", "driver_version"),
    NVML,
    "`nvmlDeviceGetName`, `nvmlDeviceGetPciInfo`, `nvmlSystemGetDriverVersion` (read once)",
    values="1",
)
# The GPU's links, as labels of trainstack_gpu_link_info; a label is empty where the driver lacks its call.
GPU_LINK_LABELS = ("pcie_generation", "pcie_width", "pcie_max_generation", "pcie_max_width", "nvlinks_active")
GPU_LINK_INFO = Metric(
    "trainstack_gpu_link_info",
    INFO,
    "The GPU's links: PCIe generation and width, now and at most; NVLinks active.",
    (*GPU_LABELS, *GPU_LINK_LABELS),
    NVML,
    "`nvmlDeviceGetCurrPcieLinkGeneration`, `nvmlDeviceGetCurrPcieLinkWidth`, `nvmlDeviceGetMaxPcieLinkGeneration`, "
    "`nvmlDeviceGetMaxPcieLinkWidth` (the most this GPU and its slot allow), and the links "
    "`nvmlDeviceGetNvLinkState` calls active, of the `NVML_FI_DEV_NVLINK_LINK_COUNT` the GPU has; read at the slow "
    "cadence (a PCIe link can train down while the exporter runs). A label is empty where the GPU or driver lacks "
    "the call: `nvlinks_active` on a GPU without NVLink",
    values="1",
    absent_when="NVML answers none of the calls",
)
GPU_UTILIZATION = Metric(
    "trainstack_gpu_utilization_ratio",
    GAUGE,
    "Share of the last sample period in which a kernel was running (not SM occupancy).",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetUtilizationRates().gpu` / 100",
    unit="0..1",
)
GPU_MEMORY_BUSY = Metric(
    "trainstack_gpu_memory_busy_ratio",
    GAUGE,
    "Share of the last sample period in which device memory was read or written.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetUtilizationRates().memory` / 100",
    unit="0..1",
)
GPU_MEMORY_USED = Metric(
    "trainstack_gpu_memory_used_bytes",
    GAUGE,
    "Device memory in use.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetMemoryInfo(version=v2).used` (v1 on old drivers, where it includes the reserved memory)",
    unit="bytes",
)
GPU_MEMORY_TOTAL = Metric(
    "trainstack_gpu_memory_total_bytes",
    GAUGE,
    "Device memory installed.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetMemoryInfo().total`",
    unit="bytes",
)
GPU_MEMORY_RESERVED = Metric(
    "trainstack_gpu_memory_reserved_bytes",
    GAUGE,
    "Device memory the driver reserves.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetMemoryInfo(version=v2).reserved`",
    unit="bytes",
    absent_when="driver without the v2 call (< R510)",
)
GPU_POWER = Metric(
    "trainstack_gpu_power_watts",
    GAUGE,
    "Power draw.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetPowerUsage` (mW averaged over 1 s on Ampere except GA100 and newer, the same as field "
    "`NVML_FI_DEV_POWER_AVERAGE` there; instantaneous on GA100 and older, which lack that field)",
    unit="W",
)
GPU_POWER_LIMIT = Metric(
    "trainstack_gpu_power_limit_watts",
    GAUGE,
    "Enforced power limit.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_POWER_CURRENT_LIMIT` (mW, the limit enforced, whoever set it); "
    "`nvmlDeviceGetEnforcedPowerLimit` on drivers without the field",
    unit="W",
)
GPU_ENERGY = Metric(
    "trainstack_gpu_energy_joules_total",
    COUNTER,
    "Energy consumed since the driver was loaded.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ since the driver loaded)",
    unit="J",
    absent_when="before Volta",
)
GPU_TEMPERATURE = Metric(
    "trainstack_gpu_temperature_celsius",
    GAUGE,
    "GPU core temperature.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`",
    unit="°C",
)
GPU_MEMORY_TEMPERATURE = Metric(
    "trainstack_gpu_memory_temperature_celsius",
    GAUGE,
    "Device memory (HBM) temperature.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_MEMORY_TEMP`",
    unit="°C",
    absent_when="GPUs without an HBM sensor (GDDR: T4, L4, P4...)",
)
GPU_SM_CLOCK = Metric(
    "trainstack_gpu_sm_clock_hertz",
    GAUGE,
    "Current SM clock.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetClockInfo(NVML_CLOCK_SM)` (MHz)",
    unit="Hz",
)
GPU_SM_CLOCK_MAX = Metric(
    "trainstack_gpu_sm_clock_max_hertz",
    GAUGE,
    "Maximum SM clock.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)` (read once)",
    unit="Hz",
)
GPU_MEMORY_CLOCK = Metric(
    "trainstack_gpu_memory_clock_hertz",
    GAUGE,
    "Current memory clock.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)`",
    unit="Hz",
)
GPU_MEMORY_CLOCK_MAX = Metric(
    "trainstack_gpu_memory_clock_max_hertz",
    GAUGE,
    "Maximum memory clock.",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)` (read once)",
    unit="Hz",
)
GPU_CLOCK_EVENT_ACTIVE = Metric(
    "trainstack_gpu_clock_event_active",
    GAUGE,
    "1 while this reason holds the clocks down (clocks event / throttle reason).",
    (*GPU_LABELS, "reason"),
    NVML,
    "`nvmlDeviceGetCurrentClocksEventReasons` (`…ThrottleReasons` on drivers before R535): one series per reason, "
    "1 while it holds the clocks down",
    values="0/1",
)
GPU_POWER_VIOLATION = Metric(
    "trainstack_gpu_power_violation_seconds_total",
    COUNTER,
    "Time the clocks were held down by the power limit.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_PERF_POLICY_POWER` (ns); `nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER)"
    ".violationTime` where the field is missing",
    unit="s",
)
GPU_THERMAL_VIOLATION = Metric(
    "trainstack_gpu_thermal_violation_seconds_total",
    COUNTER,
    "Time the clocks were held down by temperature.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_PERF_POLICY_THERMAL` (ns); `nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_THERMAL)"
    ".violationTime` where the field is missing",
    unit="s",
)
GPU_PCIE_REPLAYS = Metric(
    "trainstack_gpu_pcie_replays_total",
    COUNTER,
    "PCIe packets retransmitted.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_PCIE_REPLAY_COUNTER`",
)
GPU_ECC_CORRECTED = Metric(
    "trainstack_gpu_ecc_corrected_errors_total",
    COUNTER,
    "Single-bit ECC errors corrected since the driver was loaded.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_ECC_SBE_VOL_TOTAL` (volatile: since the driver loaded)",
    absent_when="ECC disabled or absent",
)
GPU_ECC_UNCORRECTED = Metric(
    "trainstack_gpu_ecc_uncorrected_errors_total",
    COUNTER,
    "Double-bit ECC errors since the driver was loaded.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_ECC_DBE_VOL_TOTAL`",
    absent_when="ECC disabled or absent",
)
GPU_XID_ERRORS = Metric(
    "trainstack_gpu_xid_errors_total",
    COUNTER,
    "Xid errors the driver reported (NVML critical Xid events), by Xid code.",
    (*GPU_LABELS, "xid"),
    NVML,
    "NVML event set registered for `nvmlEventTypeXidCriticalError`, drained at each scrape without waiting",
    absent_when="until the first Xid on that GPU (alert on the series existing, not only on `increase()`)",
)
GPU_NVLINK_TRANSMIT = Metric(
    "trainstack_gpu_nvlink_transmit_bytes_total",
    COUNTER,
    "Data sent over all NVLinks.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`, scope `UINT_MAX` = summed over all links (KiB)",
    unit="bytes",
    absent_when="no active NVLink (PCIe cards without a bridge)",
)
GPU_NVLINK_RECEIVE = Metric(
    "trainstack_gpu_nvlink_receive_bytes_total",
    COUNTER,
    "Data received over all NVLinks.",
    GPU_LABELS,
    NVML,
    "field `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX`, scope `UINT_MAX`",
    unit="bytes",
    absent_when="no active NVLink",
)
GPU_PCIE_TRANSMIT = Metric(
    "trainstack_gpu_pcie_transmit_bytes_per_second",
    GAUGE,
    "PCIe transmit throughput over NVML's 20 ms window (opt-in).",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)` (KiB/s over 20 ms)",
    unit="B/s",
    absent_when="unless `--pcie-throughput`",
)
GPU_PCIE_RECEIVE = Metric(
    "trainstack_gpu_pcie_receive_bytes_per_second",
    GAUGE,
    "PCIe receive throughput over NVML's 20 ms window (opt-in).",
    GPU_LABELS,
    NVML,
    "`nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)`",
    unit="B/s",
    absent_when="unless `--pcie-throughput`",
)
# GPM (Hopper and newer): what the GPU really did over each sampling period (monitoring/exporter/gpm.py).
_GPM_ABSENT = (
    "the GPU has no GPM (before Hopper), NVML refuses whole-GPU samples (MIG mode), the driver or "
    "nvidia-ml-py predates GPM (`trainstack_gpu_gpm_info` says which); and until the second sample"
)
_GPM_PERIOD = (
    "mean over the latest GPM period (`--gpm-interval`, 5 s): `nvmlGpmMetricsGet` over the period's "
    "pair of `nvmlGpmSampleGet` samples"
)
GPU_GPM_INFO = Metric(
    "trainstack_gpu_gpm_info",
    INFO,
    "Whether the GPU answers NVML's GPM metrics (SM, tensor, DRAM activity; link traffic), and why not where not.",
    (*GPU_LABELS, "supported", "reason"),
    NVML,
    "`nvmlGpmQueryDeviceSupport` and two `nvmlGpmSampleAlloc` buffers at start; `supported` `true` or `false`; "
    "`reason` empty where supported, else the call and NVML's error (`nvmlGpmSampleGet: NotSupported` on a MIG-mode "
    "GPU, `nvmlGpmQueryDeviceSupport: FunctionNotFound` on a driver without GPM) or that the GPU has none",
    values="1",
)
GPU_SM_ACTIVE = Metric(
    "trainstack_gpu_sm_active_ratio",
    GAUGE,
    "Share of the GPU's SMs busy, averaged over the sampling period (GPM; utilization counts a kernel on one SM as "
    "busy).",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_SM_UTIL` / 100, {_GPM_PERIOD}",
    unit="0..1",
    absent_when=_GPM_ABSENT,
)
GPU_SM_OCCUPANCY = Metric(
    "trainstack_gpu_sm_occupancy_ratio",
    GAUGE,
    "Warps resident on the SMs over the most they hold, averaged over the sampling period (GPM).",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_SM_OCCUPANCY` / 100, {_GPM_PERIOD}",
    unit="0..1",
    absent_when=_GPM_ABSENT,
)
GPU_TENSOR_ACTIVE = Metric(
    "trainstack_gpu_tensor_active_ratio",
    GAUGE,
    "Share of the sampling period the SMs ran tensor-core instructions of any kind (GPM).",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_ANY_TENSOR_UTIL` / 100, {_GPM_PERIOD}",
    unit="0..1",
    absent_when=_GPM_ABSENT,
)
GPU_DRAM_ACTIVE = Metric(
    "trainstack_gpu_dram_active_ratio",
    GAUGE,
    "Device memory bandwidth used over its maximum, averaged over the sampling period (GPM).",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_DRAM_BW_UTIL` / 100, {_GPM_PERIOD}",
    unit="0..1",
    absent_when=_GPM_ABSENT,
)
_GPM_BYTES = (
    "added up from the GPM periods' mean rates (MiB/s) times their length, since the exporter started: "
    "a counter, so that `rate()` over any window is the traffic in it, where a gauge of the latest period's rate "
    "would show one period per scrape. `gpm_` in the name: the same traffic from another NVML call has the plain name"
)
GPU_GPM_PCIE_TRANSMIT = Metric(
    "trainstack_gpu_gpm_pcie_transmit_bytes_total",
    COUNTER,
    "PCIe traffic from the GPU, measured by GPM.",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_PCIE_TX_PER_SEC`, {_GPM_BYTES} (`trainstack_gpu_pcie_transmit_bytes_per_second`, opt-in)",
    unit="bytes",
    absent_when=_GPM_ABSENT,
)
GPU_GPM_PCIE_RECEIVE = Metric(
    "trainstack_gpu_gpm_pcie_receive_bytes_total",
    COUNTER,
    "PCIe traffic to the GPU, measured by GPM.",
    GPU_LABELS,
    NVML,
    "`NVML_GPM_METRIC_PCIE_RX_PER_SEC`, as the transmit counter",
    unit="bytes",
    absent_when=_GPM_ABSENT,
)
GPU_GPM_NVLINK_TRANSMIT = Metric(
    "trainstack_gpu_gpm_nvlink_transmit_bytes_total",
    COUNTER,
    "NVLink traffic from the GPU over all its links, measured by GPM.",
    GPU_LABELS,
    NVML,
    f"`NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC`, {_GPM_BYTES} (`trainstack_gpu_nvlink_transmit_bytes_total`, read "
    "at the slow cadence from a field)",
    unit="bytes",
    absent_when=f"{_GPM_ABSENT}; a GPU without NVLink",
)
GPU_GPM_NVLINK_RECEIVE = Metric(
    "trainstack_gpu_gpm_nvlink_receive_bytes_total",
    COUNTER,
    "NVLink traffic to the GPU over all its links, measured by GPM.",
    GPU_LABELS,
    NVML,
    "`NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC`, as the transmit counter",
    unit="bytes",
    absent_when=f"{_GPM_ABSENT}; a GPU without NVLink",
)
GPU_PROCESS_MEMORY_USED = Metric(
    "trainstack_gpu_process_memory_used_bytes",
    GAUGE,
    "Device memory one process uses on the GPU (every process NVML lists, trainstack's or not).",
    (*GPU_LABELS, "pid", "process"),
    NVML,
    "`nvmlDeviceGetComputeRunningProcesses` and `nvmlDeviceGetGraphicsRunningProcesses` (`_v2` on R470 drivers), "
    "a process in both once; `process`: `nvmlSystemGetProcessName`'s base name (what nvidia-smi shows), asked once "
    "per process, empty where the exporter's PID namespace does not see the process",
    unit="bytes",
    absent_when="no process on the GPU; a figure NVML does not have (Windows WDDM); a container without the host "
    "PID namespace may see host pids, or none",
)

# --- the exporter's own (monitoring/exporter/health.py) -------------------------------------------------------

EXPORTER_NVML_UP = Metric(
    "trainstack_exporter_nvml_up",
    GAUGE,
    "1 when NVML initialised (a driver is present), else 0.",
    (),
    EXPORTER,
    "1 when `nvmlInit` succeeded at start (a driver is present); 0 on a CPU host or a broken driver, and then no "
    "GPU metric is served",
    values="0/1",
)
EXPORTER_NVML_ERRORS = Metric(
    "trainstack_exporter_nvml_errors_total",
    COUNTER,
    "Failed NVML calls by call and error (NotSupported: counted once, then the field is omitted).",
    ("call", "error"),
    EXPORTER,
    "failed NVML calls: `call` is the pynvml function (`nvmlDeviceGetFieldValues/<field>` for one field), `error` "
    "the `NVMLError_` class without its prefix (`NotSupported`, `FunctionNotFound`, `GpuIsLost`, `Unknown`, "
    "`Timeout`, `NoPermission`, `LibraryNotFound`, `DriverNotLoaded`...). `NotSupported`/`FunctionNotFound` are "
    "counted once per GPU and call",
    absent_when="until the first error",
)
EXPORTER_GPUS_LOST = Metric(
    "trainstack_exporter_gpus_lost",
    GAUGE,
    "GPUs that answered NVMLError_GpuIsLost and dropped out (need a reset).",
    (),
    EXPORTER,
    "GPUs that answered `NVMLError_GpuIsLost` since the exporter started (they need a reset)",
)
EXPORTER_COLLECTOR_DURATION = Metric(
    "trainstack_exporter_collector_duration_seconds",
    GAUGE,
    "Time the collector took in its latest run.",
    ("collector",),
    EXPORTER,
    "time the `gpu`, `training`, `hang` or `watched command` collector took in its latest run (scrape cost)",
    unit="s",
)
EXPORTER_COLLECTOR_SUCCESS = Metric(
    "trainstack_exporter_collector_success",
    GAUGE,
    "1 when the collector's latest run succeeded, else 0.",
    ("collector",),
    EXPORTER,
    "0 when the collector's latest run raised (its metrics were left out of that scrape; the rest was served)",
    values="0/1",
)
EXPORTER_GPU_SAMPLE_AGE = Metric(
    "trainstack_exporter_gpu_sample_age_seconds",
    GAUGE,
    "Time since the GPU sample served started: fast, every GPU metric; slow, the counters and slow sensors read "
    "at the slow cadence (docs/metrics.md).",
    CADENCE_LABELS,
    EXPORTER,
    "time since the GPU sample served started: `fast` for every GPU metric, `slow` for the slow ones "
    "([freshness](#freshness-and-cost-of-the-gpu-metrics)). It grows while an NVML call hangs; the "
    "`TrainstackGPUDataStale` alert fires past 3 intervals",
    unit="s",
    absent_when="NVML is down",
)
EXPORTER_GPU_SAMPLE_INTERVAL = Metric(
    "trainstack_exporter_gpu_sample_interval_seconds",
    GAUGE,
    "How often the sampler reads that part of the GPU sample (its flag).",
    CADENCE_LABELS,
    EXPORTER,
    "the sampler's cadences (`--sample-interval`, `--slow-sample-interval`)",
    unit="s",
    absent_when="NVML is down",
)
EXPORTER_GPU_SAMPLES = Metric(
    "trainstack_exporter_gpu_samples_total",
    COUNTER,
    "GPU samples taken, by cadence (a slow sample reads both parts).",
    CADENCE_LABELS,
    EXPORTER,
    "samples taken; a `slow` sample reads both parts",
    absent_when="NVML is down",
)
EXPORTER_GPU_SAMPLE_CPU = Metric(
    "trainstack_exporter_gpu_sample_cpu_seconds_total",
    COUNTER,
    "CPU time the GPU sampler spent in samples of that cadence.",
    CADENCE_LABELS,
    EXPORTER,
    "CPU the sampler spent in samples of that cadence (its thread's CPU time): `rate()` of the sum is its share of "
    "a core",
    unit="s",
    absent_when="NVML is down",
)
EXPORTER_GPU_SAMPLE_DURATION = Metric(
    "trainstack_exporter_gpu_sample_duration_seconds",
    GAUGE,
    "Wall time the latest GPU sample of that cadence took.",
    CADENCE_LABELS,
    EXPORTER,
    "wall time the latest sample of that cadence took",
    unit="s",
    absent_when="NVML is down",
)

# --- recorded series (monitoring/prometheus/rules/recording.yml) ----------------------------------------------

RANK_STEPS_RATE = Recorded("rank:trainstack_train_steps:rate2m", "optimizer steps per second")
RANK_SAMPLES_RATE = Recorded(
    "rank:trainstack_train_samples:rate2m",
    "samples per second",
)
RANK_TOKENS_RATE = Recorded(
    "rank:trainstack_train_tokens:rate2m",
    "non-padding tokens per second",
)
JOB_SAMPLES_RATE = Recorded(
    "job:trainstack_train_samples:rate2m",
    "the job's samples per second",
)
JOB_TOKENS_RATE = Recorded(
    "job:trainstack_train_tokens:rate2m",
    "the job's non-padding tokens per second",
)
RANK_STEP_DURATION_MEAN = Recorded(
    "rank:trainstack_train_step_duration_seconds:mean_rate2m", "mean wall time per optimizer step"
)
RANK_STEP_DURATION_QUANTILE = Recorded(
    "rank:trainstack_train_step_duration_seconds:quantile_rate2m",
    "step time quantiles (`quantile` 0.5, 0.9, 0.99)",
)
JOB_STEP_DURATION_QUANTILE = Recorded(
    "job:trainstack_train_step_duration_seconds:quantile_rate2m", "the job's step time quantiles"
)
RANK_DATA_WAIT_RATIO = Recorded(
    "rank:trainstack_train_data_wait:ratio_rate2m",
    "share of step time the device idled for want of a batch",
)
JOB_DATA_WAIT_RATIO = Recorded("job:trainstack_train_data_wait:ratio_rate2m", "the ranks' mean data-wait ratio")
RANK_COMM_EXPOSED_RATIO = Recorded(
    "rank:trainstack_train_comm_exposed:ratio_rate2m",
    "share of step time the rank waited for communication compute did not hide (DDP's all-reduce, FSDP's "
    "all-gathers and reduce-scatters)",
)
JOB_COMM_EXPOSED_MIN_RATIO = Recorded(
    "job:trainstack_train_comm_exposed:min_ratio_rate2m",
    "the least exposed-communication share of the job's ranks: over the threshold, every rank waits on the network",
)
RANK_TIME_SHARE = Recorded(
    "rank:trainstack_train_time:share_rate2m",
    "each part's share of the rank's time measured in the window (`part`)",
)
RANK_GOODPUT = Recorded(
    "rank:trainstack_train_goodput:ratio_rate2m",
    "goodput: the compute share of the rank's measured time",
)
JOB_GOODPUT = Recorded("job:trainstack_train_goodput:avg_ratio_rate2m", "the ranks' mean goodput")
RANK_HOST_BOUND_RATIO = Recorded(
    "rank:trainstack_train_host_bound:ratio_rate2m",
    "share of step time the rank's GPU idled though neither starved of data nor waiting on communication",
)
RANK_STRAGGLER_WAIT = Recorded(
    "rank:trainstack_train_straggler_wait:ratio_rate2m",
    "the most any rank of the job waits a step at the collectives, less this rank's wait, over the job's longest "
    "step: "
    "largest on the straggler, what the others wait for it",
)
JOB_STRAGGLER_WAIT = Recorded(
    "job:trainstack_train_straggler_wait:max_ratio_rate2m",
    "what the job's ranks wait for its straggler, as a share of step time",
)
JOB_LAST_STEP_AGE = Recorded(
    "job:trainstack_train_last_step_age:seconds",
    "seconds since the job's newest step",
)
JOB_MFU = Recorded("job:trainstack_train_mfu:avg_ratio", "the ranks' mean MFU")
GPU_MEMORY_USED_RATIO = Recorded(
    "gpu:trainstack_gpu_memory_used:ratio",
    "used over installed device memory",
)
JOB_GPU_UTILIZATION = Recorded("job:trainstack_gpu_utilization:avg_ratio", "the job's mean GPU utilization")
JOB_GPU_POWER = Recorded("job:trainstack_gpu_power_watts:sum", "the job's GPUs' power draw")
JOB_GPU_ENERGY_RATE = Recorded(
    "job:trainstack_gpu_energy_joules:rate2m",
    "the job's GPUs' energy per second",
)
JOB_GPU_ENERGY_PER_SAMPLE = Recorded("job:trainstack_gpu_energy_per_sample:joules", "joules per training sample")
GPU_THERMAL_THROTTLE = Recorded(
    "gpu:trainstack_gpu_thermal_throttle:ratio_rate2m",
    "share of time the clocks were held down by temperature",
)
GPU_POWER_THROTTLE = Recorded(
    "gpu:trainstack_gpu_power_throttle:ratio_rate2m",
    "share of time the clocks were held down by the power limit",
)

METRICS: tuple[Metric, ...] = tuple(value for value in dict(globals()).values() if isinstance(value, Metric))
RECORDED: tuple[Recorded, ...] = tuple(value for value in dict(globals()).values() if isinstance(value, Recorded))
# Every series a query can name -> its entry's name: a histogram's `_bucket`, `_sum` and `_count` are its metric's.
ENTRY_OF_SERIES: dict[str, str] = {
    **{sample: metric.name for metric in METRICS for sample in metric.sample_names},
    **{series.name: series.name for series in RECORDED},
}


def rank_metric(metric: Metric):
    """The prometheus_client metric a rank writes into its multiprocess files. Gauges keep the most recent value
    (the exporter's merge then carries no `pid`). prometheus_client is imported here, not at the top: it picks
    its multiprocess mode from PROMETHEUS_MULTIPROC_DIR when first imported."""
    from prometheus_client import Counter, Gauge, Histogram

    if metric.type == COUNTER:
        return Counter(metric.family_name, metric.help, metric.labels)
    if metric.type == GAUGE:
        return Gauge(metric.family_name, metric.help, metric.labels, multiprocess_mode="mostrecent")
    if metric.type == HISTOGRAM:
        return Histogram(metric.family_name, metric.help, metric.labels, buckets=metric.buckets)
    raise ValueError(f"{metric.name}: a rank writes no {metric.type} metrics")


def family(metric: Metric, labels: tuple[str, ...] | None = None, **value):
    """An empty metric family for a collector to fill at a scrape. `labels` overrides the entry's (an info
    family takes its identifying labels; the rest come with each value); `value=` for an unlabelled one."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    kind = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily, INFO: InfoMetricFamily}[metric.type]
    labels = metric.labels if labels is None else labels
    return kind(metric.family_name, metric.help, labels=list(labels) if labels else None, **value)
