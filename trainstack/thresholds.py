"""When a figure counts as a problem, as data: the one place a threshold's number is written.

Each entry is read by every place that judges a figure. The alert rules take their numbers from it
(monitoring/prometheus/build_rules.py writes monitoring/prometheus/rules/alerts.yml, whose PromQL Prometheus loads
as it is), `trainstack diagnose` takes its defaults from it (`Thresholds`, below), and the Grafana
panels draw it as their red line (monitoring/grafana/build_dashboards.py), as does the report's data-wait figure.
The rule file is generated rather than read back because Prometheus needs concrete numbers in its expressions, and a
number read back out of PromQL is a guess at the expression's shape; generating keeps the committed file plain
PromQL while the number lives here. tests/unit/monitoring/test_monitoring_rules.py fails while alerts.yml differs from
what the table gives.

To change a threshold: edit its value here and run `make generate` (the rule files, the tables of docs/alerts.md,
the dashboards, k8s/common/generated); move the alert's unit test in monitoring/prometheus/tests/ if its samples
sat near the old number. A new check's threshold is one entry here, which its problem (trainstack/problems.py),
its alert (build_rules.py) and its verdict (monitoring/diagnose/verdicts.py) read by name, and `Thresholds` gains a
field by itself (docs/architecture.md, "Adding a verdict").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainstack.errors import ConfigError


@dataclass(frozen=True)
class Threshold:
    name: str
    """The field of diagnose's Thresholds, and the threshold's name in docs/alerts.md."""
    value: float
    unit: str
    """What the number counts, as docs/alerts.md writes it."""
    meaning: str
    """When the figure counts as a problem."""
    alert: str = ""
    """The alert whose expression compares against it; empty for a diagnose-only threshold."""

    @property
    def promql(self) -> str:
        """The number as an alert expression writes it: 0.2, 600, 3."""
        return f"{self.value:g}"

    @property
    def percent(self) -> str:
        """A share as docs and alert texts write it: 0.2 -> 20%."""
        return f"{100 * self.value:g}%"


INPUT_BOUND = Threshold(
    "input_bound_ratio",
    0.2,
    "share of step time",
    "a rank's device waits for the next batch more than this share of its step time",
    "TrainstackInputBound",
)
STRAGGLER = Threshold(
    "straggler_wait_ratio",
    0.15,
    "share of step time",
    "the other ranks wait at the collectives more than this share of their step time beyond the least-waiting "
    "rank, which is the straggler (trainstack/ratios.py STRAGGLER_WAIT); set above the spread that the ranks' "
    "natural jitter gives healthy ranks, even on a host whose cores other work shares, and below the wait that a "
    "rank given a sixth of a step's extra work causes, so that rank is named and jitter is not",
    "TrainstackStragglerRank",
)
COMM_BOUND = Threshold(
    "comm_bound_ratio",
    0.25,
    "share of step time",
    "every rank of the job waits for its gradient all-reduce, after its backward compute has ended, more than this "
    "share of its step time (a quarter of each step spent waiting on the network; a straggler's peers wait too, "
    "but the straggler itself does not)",
    "TrainstackCommunicationBound",
)
SHM_PER_RANK = Threshold(
    "shm_mib_per_rank",
    96.0,
    "MiB of /dev/shm per rank on the node",
    "/dev/shm is smaller than this times the ranks on its node: NCCL's shared-memory transport and proxy buffers "
    "need about this much per GPU rank (NVIDIA's PyTorch containers ask for --shm-size=1g for 8 GPUs, this figure "
    "with room to spare; a container's default 64 MiB is too small for even one); `trainstack doctor` adds the "
    "loader workers' batches to it before a run",
)
HOST_BOUND = Threshold(
    "host_bound_ratio",
    0.2,
    "share of step time",
    "a rank's GPU idles, though neither starved of data nor waiting on communication, more than this share of its "
    "step time (a fifth of each step lost to kernel launches and host synchronizations, as much as the input-bound "
    "threshold allows the loader, and well above what NVML's coarse utilization samples can tell apart)",
    "TrainstackHostBound",
)
STALL = Threshold(
    "stall_seconds", 600.0, "s", "no rank of the job has completed a step for this long", "TrainstackTrainingStalled"
)
HANG_STEP_MULTIPLE = Threshold(
    "hang_step_multiple",
    20.0,
    "× the median step",
    "no rank has stepped for this many of the run's median step times (and at least hang_floor_seconds): the "
    "launcher (`trainstack train`, `trainstack watch`) collects each rank's stack and Flight Recorder entries into "
    "RUN_DIR/hang/, once per stall (nvidia-resiliency-ext sets its hang timeout from observed step times too; 20 "
    "steps' time is well past a log interval's or an evaluation's pause on a steady run)",
)
HANG_FLOOR = Threshold(
    "hang_floor_seconds",
    60.0,
    "s",
    "the shortest stall that collects hang evidence, however short the steps (a checkpoint write or a loader "
    "restart takes seconds; TRAINSTACK_HANG_SECONDS sets the threshold outright)",
)
HANG_CEILING = Threshold(
    "hang_ceiling_seconds",
    300.0,
    "s",
    "the longest a stall waits for evidence, however long the steps, and the wait for the first step (from the "
    "latest rank's start of its loop; no step time says how long a first step with a compile takes): half the "
    "default --collective-timeout (600 s), so the evidence is there before the timeout ends the run; trainstack's "
    "ranks still starting before their loops (loading data, building the model) wait half the timeout itself",
)
GPU_IDLE = Threshold(
    "gpu_idle_ratio",
    0.05,
    "utilization",
    "a GPU no rank uses is busy under this share of the time",
    "TrainstackGPUUnused",
)
PROCESS_GPU_BUSY = Threshold(
    "process_gpu_busy_ratio",
    0.05,
    "utilization",
    "one process is the main memory user of two or more GPUs busy at least this share of the time (nn.DataParallel, "
    "or a model split by hand; a CUDA context left on an idle GPU does not count)",
    "TrainstackOneProcessManyGPUs",
)
MEMORY_FULL = Threshold(
    "memory_full_ratio",
    0.95,
    "share of memory",
    "a GPU's used memory is over this share of its installed memory",
    "TrainstackGPUMemoryNearlyFull",
)
THERMAL_THROTTLE = Threshold(
    "thermal_throttle_ratio",
    0.1,
    "share of time",
    "a GPU's clocks are held down by temperature more than this share of the time",
    "TrainstackGPUThermalThrottling",
)
POWER_THROTTLE = Threshold(
    "power_throttle_ratio",
    0.5,
    "share of time",
    "a GPU sits at its power cap more than this share of the time...",
    "TrainstackGPUPowerThrottling",
)
POWER_THROTTLE_CLOCK = Threshold(
    "power_throttle_clock_ratio",
    0.8,
    "share of the maximum clock",
    "...with its SM clock under this share of its maximum",
    "TrainstackGPUPowerThrottling",
)
LOW_MFU = Threshold(
    "low_mfu_ratio",
    0.2,
    "share of peak FLOP/s",
    "the ranks' mean MFU is under this (well-tuned transformer training reaches 0.35-0.55 of dense peak; under 0.2 "
    "leaves most of the GPU unused)",
)
GPU_UNDERUSED_UTILIZATION = Threshold(
    "gpu_underused_utilization_ratio",
    0.8,
    "utilization",
    "a GPU reads busy: a kernel runs at least this share of the time (what NVML's utilization says of a GPU doing "
    "its job; under it the GPU idles between kernels, which host-bound and input-bound explain)...",
    "TrainstackGPUUnderused",
)
GPU_UNDERUSED_SM_ACTIVE = Threshold(
    "gpu_underused_sm_active_ratio",
    0.5,
    "share of SMs busy",
    "...while fewer than this share of its SMs work on average (GPM): half the SMs idle while a kernel runs is a "
    "grid too small for the GPU (a per-GPU batch too small, a chain of tiny kernels); dense bf16 training keeps "
    "0.7-0.9 of an H100's SMs busy, and a model that cannot fill half of them gains more from a larger batch than "
    "from more GPUs",
    "TrainstackGPUUnderused",
)
NO_TENSOR_SM_ACTIVE = Threshold(
    "no_tensor_cores_sm_active_ratio",
    0.3,
    "share of SMs busy",
    "a GPU works (at least this share of its SMs busy: well above the few percent an idle or launch-bound GPU "
    "shows, so that a GPU with nothing to do is not blamed for its tensor cores)...",
    "TrainstackNoTensorCores",
)
NO_TENSOR_ACTIVE = Threshold(
    "no_tensor_cores_tensor_active_ratio",
    0.02,
    "share of time",
    "...while its tensor cores run under this share of the time: fp32 matmuls without TF32 never use them, and any "
    "bf16/fp16 or TF32 matmul of a training step keeps them busy well above 2% (a transformer's matmuls are most of "
    "its FLOPs)",
    "TrainstackNoTensorCores",
)
MEMORY_BOUND_DRAM = Threshold(
    "memory_bound_dram_ratio",
    0.8,
    "share of DRAM bandwidth",
    "a GPU's device-memory bandwidth is used above this share while its SMs work: its kernels wait on memory, "
    "which diagnose says as evidence (HBM sustains about 90% of its nominal bandwidth in practice, so 80% is near "
    "the most it delivers)",
)
GPU_SAMPLE_STALE = Threshold(
    "gpu_sample_stale_intervals",
    3.0,
    "sampling intervals",
    "the exporter's newest GPU sample is older than this many of its sampling intervals",
    "TrainstackGPUDataStale",
)

THRESHOLDS: tuple[Threshold, ...] = tuple(value for value in dict(globals()).values() if isinstance(value, Threshold))


def _check_positive(self) -> None:
    for name, value in vars(self).items():
        if not value > 0:
            raise ConfigError(f"threshold {name.replace('_', '-')} must be positive, got {value}")


if TYPE_CHECKING:
    # What mypy sees of the class built below: a field per entry, each a float, read by name. mypy cannot run
    # make_dataclass, and a class statement listing the fields would be the second list the entries avoid.
    class Thresholds:
        def __init__(self, **limits: float) -> None: ...

        def __getattr__(self, name: str) -> float: ...

else:
    Thresholds = dataclasses.make_dataclass(
        "Thresholds",
        [(t.name, float, dataclasses.field(default=t.value)) for t in THRESHOLDS],
        frozen=True,
        namespace={"__post_init__": _check_positive},
    )
    Thresholds.__doc__ = """The thresholds one judgement applies: a field per entry above, defaulting to its value, so
    `trainstack diagnose` and the alerts (generated from the same entries) agree on what is wrong, while diagnose's
    flags and the tests may set their own. Built from the entries, so that a new threshold is one entry and no second
    list."""
