"""Each problem a run can have, defined once: its kind, its thresholds, the ratios it reads, its alerts, its fix in
each launcher's words, its ceiling rule and the options `trainstack tune` tries for it.

As trainstack/ratios.py defines a figure once for Python and PromQL, this registry defines a problem once for every
place that names it: `trainstack diagnose` (monitoring/diagnose/verdicts.py writes each verdict's kind and fix from
its entry), the alert rules (monitoring/prometheus/build_rules.py takes each alert's fix from the entry that lists
the alert), the ceilings (trainstack/ceilings.py: WHAT_FIX_GAINS), `trainstack tune` (commands/tune/candidates.py
keys its candidates by kind) and the docs tables built from them. tests/unit/trainstack/test_problems.py walks the registry and
checks which kinds have which parts, and that every alert of the rule files belongs to one kind.

A part that does not apply to a kind is None (or empty), for the reason its field's docstring gives. Adding a
verdict: docs/architecture.md, "Adding a verdict". Nothing here imports torch or monitoring/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainstack import catalog, ratios
from trainstack import thresholds as T
from trainstack.rundir import LAUNCHER_TRAIN
from trainstack.thresholds import Threshold

Figure = ratios.Ratio | ratios.WaitBeyond | ratios.Throttle
"""A figure a problem is judged on (trainstack/ratios.py): one definition for Python and PromQL."""


@dataclass(frozen=True)
class Fix:
    """What to do about a problem, in the words of whoever started the ranks."""

    train: str
    """In `trainstack train`'s words (its flags); the alerts say this one, as they do not know the launcher."""
    script: str | None = None
    """In a watched script's own words (its DataLoader, model and launcher arguments); None where the fix names no
    `trainstack train` flag, so the same words serve every launcher."""

    def words(self, launchers: Sequence[str]) -> str:
        """The fix for ranks started by `launchers` (rundir.LAUNCHER_TRAIN, or a watched command's): train's flags
        where it started every rank, else the script's own knobs (a watched command, or a loop that does not say
        what started it)."""
        if self.script is None or (launchers and all(launcher == LAUNCHER_TRAIN for launcher in launchers)):
            return self.train
        return self.script


@dataclass(frozen=True)
class Gain:
    """A ceiling rule (trainstack/ceilings.py): what the share of time is, and the fix whose speedup it caps."""

    what: str
    """The share, with `{share}` where its percentage goes."""
    fix: str


@dataclass(frozen=True)
class Problem:
    kind: str
    """The verdict's `kind` as diagnose, summary.json and the report write it."""
    detection: str | None
    """The function of monitoring/diagnose/verdicts.py that finds it; None for a problem only an alert sees (the
    exporter's own state: diagnose reads the exporter, so it cannot judge it gone) or only the run's time breakdown
    measures (pauses)."""
    thresholds: tuple[Threshold, ...]
    """The thresholds it is judged against (trainstack/thresholds.py); empty where its detection is a fact, not a
    figure over a number (no training series, no step yet, an XID error)."""
    figures: tuple[Figure, ...]
    """The ratios it reads (trainstack/ratios.py); empty where it reads a plain series or a fact."""
    alerts: tuple[str, ...]
    """The alerts of monitoring/prometheus/rules/alerts.yml that fire on it; empty where Prometheus cannot see it
    (a source without training series, ranks before their first step, MFU: peak FLOP/s is known only where the
    device is, and the pauses, which end before a scrape would judge them)."""
    fix: Fix | None
    """What to do about it; None for the pauses, which no verdict names (the report and summary.json give their
    ceiling)."""
    gain: Gain | None = None
    """Its ceiling rule; None where the problem takes no share of the step or wall time that a fix removes whole."""
    tune: tuple[str, ...] | None = None
    """The train/rank/config.py options `trainstack tune` tries for it (commands/tune/candidates.py); None where
    no option of trainstack's own config fixes it (the hardware, the host, the launcher's rank count)."""
    when: str | None = None
    """When diagnose names it, as docs/diagnostics.md's verdict table says (generated from here); None for a kind
    diagnose does not judge."""


NO_TRAINING = "no-training"
NO_STEP_YET = "no-step-yet"
STALLED = "stalled"
GPUS_UNUSED = "gpus-unused"
ONE_PROCESS_MANY_GPUS = "one-process-many-gpus"
INPUT_BOUND = "input-bound"
STRAGGLER = "straggler"
COMM_BOUND = "comm-bound"
HOST_BOUND = "host-bound"
GPU_UNDERUSED = "gpu-underused"
NO_TENSOR_CORES = "no-tensor-cores"
THROTTLED = "throttled"
MEMORY_FULL = "memory-full"
LOW_MFU = "low-mfu"
GPU_DATA_STALE = "gpu-data-stale"
XID = "xid"
EXPORTER_DOWN = "exporter-down"
NVML_UNAVAILABLE = "nvml-unavailable"
PAUSES = "pauses"

_PROBLEMS = (
    Problem(
        NO_TRAINING,
        "no_training",
        (T.GPU_IDLE,),
        (),
        (),
        Fix(
            "start the run with trainstack train (its exporter reads RUN_DIR/metrics); for a separate exporter pass "
            "--metrics-dir RUN_DIR/metrics; with Prometheus, check --job and the target on its /targets page"
        ),
        when=(
            "the source has no training series and nothing uses the GPUs: no process on one, none busy (ranks not "
            "started, exporter on the wrong metrics dir, wrong `--job`)"
        ),
    ),
    Problem(
        NO_STEP_YET,
        "not_started",
        (T.HANG_CEILING,),
        (),
        (),
        Fix(
            "wait for the first step (model build, data loading, rendezvous); if it never comes, the launcher "
            f"(trainstack train or watch) collects where each rank waits into RUN_DIR/hang/ "
            f"{T.HANG_CEILING.value:g} s after the last rank started its loop (trainstack train's ranks "
            "still starting, before their loops: half of --collective-timeout), and diagnose then names it"
        ),
        when=(
            "ranks registered, none has completed a step (once the launcher has collected hang evidence while the "
            "first step was awaited, `stalled` instead, naming where the ranks wait)"
        ),
    ),
    Problem(
        STALLED,
        "stalled",
        (T.STALL, T.HANG_STEP_MULTIPLE, T.HANG_FLOOR, T.HANG_CEILING, T.GPU_IDLE),
        (),
        ("TrainstackTrainingStalled", "TrainstackRankHung"),
        Fix(
            "the launcher (trainstack train or watch) collects where each rank waits into RUN_DIR/hang/ once no "
            f"rank has stepped for {T.HANG_STEP_MULTIPLE.value:g} median steps (at least {T.HANG_FLOOR.value:g} s), "
            "and diagnose then names the rank and the collective or frame it waits in (the exporter beside the run "
            "serves it; elsewhere --run-dir RUN_DIR); --collective-timeout turns such a hang into an error naming "
            "the rank; rerun the same command to resume from the last checkpoint"
        ),
        when=(
            f"no rank stepped for `--stall-seconds` (default {T.STALL.value:g}) while the exporter answers, or as "
            "soon as the launcher has collected hang evidence since the last step (served by the exporter beside "
            "the run, or read with `--run-dir`) (see *When a run hangs*): then it names the rank that never "
            "joined the collective the others wait in, and where that rank is; without it, ranks behind the "
            "others are named, and so is a rank whose GPU idles while the others' read busy (NCCL kernels spin "
            "while they wait)"
        ),
    ),
    Problem(
        GPUS_UNUSED,
        "gpus_unused",
        (T.GPU_IDLE,),
        (),
        ("TrainstackGPUUnused",),
        Fix(
            "start one rank per GPU (trainstack train, or torchrun/accelerate launch with --nproc-per-node equal to "
            "the GPU count) instead of a single process or nn.DataParallel; or hide the GPU with CUDA_VISIBLE_DEVICES"
        ),
        when=(
            f"a GPU that no rank's `uuid` (`{catalog.TRAIN_RANK_INFO.name}`) points at, under {T.GPU_IDLE.percent} "
            f"utilization; without rank telemetry, a GPU under {T.GPU_IDLE.percent} that no process holds memory "
            "on while processes use others (its alert: a GPU no rank uses while the ranks train)"
        ),
    ),
    Problem(
        ONE_PROCESS_MANY_GPUS,
        "one_process_many_gpus",
        (T.PROCESS_GPU_BUSY,),
        (),
        ("TrainstackOneProcessManyGPUs",),
        Fix(
            "run one process per GPU with DistributedDataParallel: torchrun --nproc-per-node <GPUs> (or trainstack "
            "train, or accelerate launch) instead of nn.DataParallel, which is single-process: one Python thread "
            "drives every GPU, and its first GPU scatters the batch, gathers the outputs and computes the loss while "
            "the others wait; a model split across GPUs by hand runs one GPU at a time: shard it with FSDP, one "
            "process per GPU"
        ),
        when=(
            f"one process is the main memory user of 2 or more GPUs busy at least {T.PROCESS_GPU_BUSY.percent} "
            "(`nn.DataParallel`, or a model split by hand); from NVML's process map alone, rank telemetry or not"
        ),
    ),
    Problem(
        INPUT_BOUND,
        "input_bound",
        (T.INPUT_BOUND,),
        (ratios.DATA_WAIT_SHARE,),
        ("TrainstackInputBound",),
        Fix(
            "raise --num-workers, pre-tokenize or move decoding out of __getitem__, or put the data on faster storage",
            "raise DataLoader(num_workers=...) and keep them across epochs with persistent_workers=True (else each "
            "epoch starts them again, seconds each under the spawn or forkserver start method; transformers' Trainer: "
            "TrainingArguments(dataloader_num_workers=..., dataloader_persistent_workers=True)), pre-tokenize or "
            "move decoding out of __getitem__, or put the data on faster storage",
        ),
        Gain("the loader starves the device {share} of step time", "a loader that keeps up"),
        ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers"),
        when=(
            f"a rank's device idle for want of a batch more than {T.INPUT_BOUND.percent} of its step time: on a "
            "GPU rank the GPU's starvation on its own timeline (the host's wait in `next()` is shown beside it, "
            "never judged), on a CPU rank the host's time blocked on its loader"
        ),
    ),
    Problem(
        STRAGGLER,
        "straggler",
        (T.STRAGGLER,),
        (ratios.STRAGGLER_WAIT,),
        ("TrainstackStragglerRank",),
        Fix(
            "check its GPU's clocks, temperature and throttle reasons, its loader, and work only it does between "
            "steps (logging, evaluation, checkpoints on one rank); move other processes off its GPU and CPU cores, "
            "or bucket batches by length"
        ),
        Gain("the other ranks wait for the straggler {share} of step time", "a straggler as fast as its peers"),
        ("grad_accum",),
        when=(
            f"the other ranks wait at the collectives more than {T.STRAGGLER.percent} of their step time beyond "
            'the least-waiting rank, which is named; the cost is what they wait for it per step (below, "How '
            'trainstack finds a straggler"); needs the waits of at least two ranks'
        ),
    ),
    Problem(
        COMM_BOUND,
        "comm_bound",
        (T.COMM_BOUND, T.SHM_PER_RANK),
        (ratios.COMM_EXPOSED_SHARE,),
        ("TrainstackCommunicationBound",),
        Fix(
            "fewer all-reduces per sample: a larger per-rank --batch-size or --gradient-accumulation-steps (the "
            "micro-batches before the last skip the all-reduce under no_sync); fewer, larger buckets (DDP "
            "bucket_cap_mb); a faster link: check NVLink/P2P (nvidia-smi topo -m), /dev/shm size in containers, and "
            "that NCCL_P2P_DISABLE, NCCL_SHM_DISABLE or NCCL_IB_DISABLE are not set; or --strategy fsdp",
            "fewer all-reduces per sample: a larger per-GPU batch (your DataLoader(batch_size=...)) or gradient "
            "accumulation, or more of it, with the micro-batches before the last under model.no_sync() "
            "(transformers: gradient_accumulation_steps; Lightning: Trainer(accumulate_grad_batches=...); "
            "Accelerate: Accelerator(gradient_accumulation_steps=...)); fewer, larger buckets (DDP(model, "
            "bucket_cap_mb=...); transformers: ddp_bucket_cap_mb; Lightning: DDPStrategy(bucket_cap_mb=...); "
            "Accelerate: kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=...)]); a faster link: check NVLink/P2P (nvidia-smi topo -m), /dev/shm size in "
            "containers, and that NCCL_P2P_DISABLE, NCCL_SHM_DISABLE or NCCL_IB_DISABLE are not set; or FSDP "
            "(fully_shard) instead of DDP",
        ),
        Gain(
            "every rank waits for communication compute does not hide at least {share} of step time",
            "communication that compute hides",
        ),
        ("grad_accum", "ddp_bucket_cap_mb", "ddp_static_graph", "ddp_comm_hook"),
        when=(
            f"every rank waits for communication that compute did not hide more than {T.COMM_BOUND.percent} of its "
            "step time: under DDP the gradient all-reduce after backward compute has ended, under FSDP the "
            "all-gathers and reduce-scatters (the least exposed rank is judged: a straggler's peers wait for it "
            "too, the straggler does not)"
        ),
    ),
    Problem(
        HOST_BOUND,
        "host_bound",
        (T.HOST_BOUND,),
        (ratios.HOST_BOUND_SHARE,),
        ("TrainstackHostBound",),
        Fix(
            "give each kernel launch more work: a larger per-rank --batch-size (lower --gradient-accumulation-steps "
            "to keep the global batch); --compile (torch.compile fuses small kernels: fewer launches); and no host "
            "synchronization in the loop (.item(), printing or copying tensors to the CPU each step)",
            "give each kernel launch more work: a larger per-GPU batch in your DataLoader(batch_size=...) "
            "(transformers: per_device_train_batch_size; fewer accumulation micro-batches to keep the global batch); model = torch.compile(model) (torch.compile fuses "
            "small kernels: fewer launches); and no host synchronization in the loop (.item(), printing or copying "
            "tensors to the CPU each step)",
        ),
        Gain("the GPU idles waiting for the host {share} of step time", "a host that keeps the GPU fed"),
        ("batch_size", "compile"),
        when=(
            f"a rank's GPU idles more than {T.HOST_BOUND.percent} of its step time although it is neither starved "
            "of data nor waiting on communication (NVML's utilization samples of its GPU, less its starvation: "
            'docs/metrics.md, "Where each rank\'s time goes"); GPU ranks only, CPU ranks do not measure it'
        ),
    ),
    Problem(
        GPU_UNDERUSED,
        "gpu_underused",
        (T.GPU_UNDERUSED_UTILIZATION, T.GPU_UNDERUSED_SM_ACTIVE, T.MEMORY_BOUND_DRAM),
        (),
        ("TrainstackGPUUnderused",),
        # The verdict adds bf16 and torch.compile where the ranks say they are off (verdicts.gpu_underused).
        Fix(
            "a larger per-GPU --batch-size (lower --gradient-accumulation-steps to keep the global batch): more work "
            "per kernel fills more SMs",
            "a larger per-GPU batch in your DataLoader(batch_size=...) (transformers: per_device_train_batch_size; "
            "fewer accumulation micro-batches to keep the global batch): more work per kernel fills more SMs",
        ),
        when=(
            f"a GPU reads busy (utilization at least {T.GPU_UNDERUSED_UTILIZATION.percent}) while under "
            f"{T.GPU_UNDERUSED_SM_ACTIVE.percent} of its SMs work (GPM's SM activity); the evidence adds "
            "occupancy, tensor and DRAM activity, the rank's samples per step, precision and compile setting, and "
            f'"memory-bound" where DRAM bandwidth is at {T.MEMORY_BOUND_DRAM.percent} of its maximum or more'
        ),
    ),
    Problem(
        NO_TENSOR_CORES,
        "no_tensor_cores",
        (T.NO_TENSOR_SM_ACTIVE, T.NO_TENSOR_ACTIVE),
        (),
        ("TrainstackNoTensorCores",),
        Fix(
            "--mixed-precision bf16 (bf16 autocast); or, to stay in fp32, TF32 for its matmuls: "
            'torch.set_float32_matmul_precision("high"); matmul sizes that are multiples of 8 let the tensor cores '
            "take them",
            "torch.autocast(device_type='cuda', dtype=torch.bfloat16) (bf16 autocast); or, to stay in fp32, TF32 "
            'for its matmuls: torch.set_float32_matmul_precision("high"); matmul sizes that are multiples of 8 let '
            "the tensor cores take them",
        ),
        when=(
            f"at least {T.NO_TENSOR_SM_ACTIVE.percent} of a GPU's SMs work while its tensor cores run under "
            f"{T.NO_TENSOR_ACTIVE.percent} of the time (fp32 without TF32)"
        ),
    ),
    Problem(
        THROTTLED,
        "throttled",
        (T.THERMAL_THROTTLE, T.POWER_THROTTLE, T.POWER_THROTTLE_CLOCK),
        (ratios.THERMAL_THROTTLE, ratios.POWER_THROTTLE, ratios.SM_CLOCK_SHARE),
        ("TrainstackGPUThermalThrottling", "TrainstackGPUPowerThrottling"),
        Fix(
            "thermal: check fans, airflow and inlet temperature; power: compare the power limit with the card's "
            "rating and restore it (nvidia-smi -rpl), or have the node's power delivery checked"
        ),
        when=(
            f"thermal violation over {T.THERMAL_THROTTLE.percent} of the time; or at the power cap over "
            f"{T.POWER_THROTTLE.percent} with the SM clock under {T.POWER_THROTTLE_CLOCK.percent} of max"
        ),
    ),
    Problem(
        MEMORY_FULL,
        "memory_full",
        (T.MEMORY_FULL,),
        (ratios.MEMORY_USED_SHARE,),
        ("TrainstackGPUMemoryNearlyFull",),
        Fix(
            "lower --batch-size and raise --gradient-accumulation-steps, use --mixed-precision bf16, or set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "lower your DataLoader(batch_size=...) and accumulate gradients over more micro-batches, use bf16 "
            "autocast (torch.autocast(device_type='cuda', dtype=torch.bfloat16)), or set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ),
        when=(f"GPU memory over {T.MEMORY_FULL.percent} used"),
    ),
    Problem(
        LOW_MFU,
        "low_mfu",
        (T.LOW_MFU,),
        (),
        (),
        Fix(
            "first rule out input-bound and stragglers; then a larger per-rank --batch-size, --mixed-precision bf16, "
            "fewer host synchronizations in the loop, or a model big enough to fill the GPU",
            "first rule out input-bound and stragglers; then a larger per-GPU batch in your "
            'DataLoader(batch_size=...), bf16 autocast (torch.autocast("cuda", dtype=torch.bfloat16)), fewer host '
            "synchronizations in the loop, or a model big enough to fill the GPU",
        ),
        when=(f"mean MFU under {T.LOW_MFU.percent} (where the device's peak is known)"),
    ),
    Problem(
        GPU_DATA_STALE,
        "gpu_data_stale",
        (T.GPU_SAMPLE_STALE,),
        (),
        ("TrainstackGPUDataStale",),
        Fix(
            "check nvidia-smi and the kernel log for Xid errors on the node; drain it if nvidia-smi hangs too, else "
            "restart the exporter"
        ),
        when=(
            f"the exporter's GPU sample older than {T.GPU_SAMPLE_STALE.value:g} of its sampling intervals (an NVML "
            "call hangs): the GPU figures above are old"
        ),
    ),
    Problem(
        XID,
        None,
        (),
        (),
        ("TrainstackGPUXidError",),
        Fix("restart from the last checkpoint; drain the node and have the GPU checked when a hardware code repeats"),
    ),
    Problem(
        EXPORTER_DOWN,
        None,
        (),
        (),
        ("TrainstackExporterDown",),
        Fix("check the target on Prometheus' /targets page and the trainer's log"),
    ),
    Problem(
        NVML_UNAVAILABLE,
        None,
        (),
        (),
        ("TrainstackNVMLUnavailable",),
        Fix(f"give the exporter's container the GPUs; {catalog.EXPORTER_NVML_ERRORS.name} names the failing call"),
    ),
    Problem(
        PAUSES,
        None,
        (),
        (),
        (),
        None,
        Gain("evaluation and checkpoints pause training {share} of the wall time", "a loop that never pauses"),
    ),
)

PROBLEMS: dict[str, Problem] = {problem.kind: problem for problem in _PROBLEMS}
"""kind -> its problem, in diagnose's order (most fundamental first), then those only an alert or the time breakdown
sees."""

WHAT_FIX_GAINS: dict[str, tuple[str, str]] = {
    kind: (problem.gain.what, problem.gain.fix) for kind, problem in PROBLEMS.items() if problem.gain
}
"""Per kind with a ceiling rule: what the share is, and the fix whose ceiling it gives (trainstack/ceilings.py)."""


def of_alert(alert: str) -> Problem:
    """The problem an alert fires on."""
    return next(problem for problem in _PROBLEMS if alert in problem.alerts)
