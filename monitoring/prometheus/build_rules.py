#!/usr/bin/env python3
"""Build the Prometheus rule files from code: monitoring/prometheus/rules/recording.yml and alerts.yml, the
alert and threshold tables in docs/alerts.md, and the verdict table in docs/diagnostics.md.

The alerts take their numbers from the threshold table (trainstack/thresholds.py), their fixes from the problem
registry (trainstack/problems.py) and the recording rules their ratios from trainstack/ratios.py, the same definitions `trainstack diagnose`, the report and the Grafana panels use,
so none of them can drift from the alerts. The rule files are committed as plain PromQL (Prometheus, promtool and
the Kubernetes PrometheusRules load them as they are); `--check` writes nothing and fails when a committed file
differs from what this script builds (tests/unit/monitoring/test_monitoring_rules.py runs it).

usage: python monitoring/prometheus/build_rules.py [--check]
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: the tables come from this checkout
from trainstack import breakdown, catalog, problems, ratios, thresholds  # noqa: E402
from trainstack.generated import write_or_check  # noqa: E402

RULES_DIR = ROOT / "monitoring/prometheus/rules"
DOCS_FILE = ROOT / "docs/alerts.md"
VERDICTS_DOCS = "diagnostics.md"  # beside DOCS_FILE: docs/diagnostics.md
W = ratios.WINDOW
WIDTH = 116  # the files' line length


@dataclass(frozen=True)
class Record:
    series: catalog.Recorded
    expr: str
    labels: tuple[tuple[str, str], ...] = ()
    comment: str = ""


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str
    summary: str
    cause: str
    """What the alert sees and its likely cause; the description adds "Fix: " and the fix of its problem
    (trainstack/problems.py), the one the verdict gives (tests/unit/monitoring/test_monitoring_rules.py)."""
    fires_when: str
    """docs/alerts.md's one-line summary of the expression."""
    for_: str = ""
    comment: str = ""
    fix: str = ""
    """The alert's own fix, where it carries one its problem's fix cannot (a label of the hang evidence's); empty
    for the problem's."""

    @property
    def description(self) -> str:
        if self.fix:
            return f"{self.cause} Fix: {self.fix}."
        problem_fix = problems.of_alert(self.name).fix
        if problem_fix is None:
            raise ValueError(f"{self.name}: its problem has no fix, so the alert must carry its own")
        return f"{self.cause} Fix: {problem_fix.train}."


@dataclass(frozen=True)
class RuleFile:
    name: str
    header: str
    groups: tuple[tuple[str, tuple[Record | Alert, ...]], ...]


def quantiles(series: catalog.Recorded, by: str) -> tuple[Record, ...]:
    buckets = f"rate({catalog.TRAIN_STEP_DURATION.sample('bucket')}[{W}])"
    source = f"sum by ({by}) ({buckets})" if by else buckets
    return tuple(
        Record(series, f"histogram_quantile({q}, {source})", (("quantile", q),)) for q in ("0.5", "0.9", "0.99")
    )


RECORDING = RuleFile(
    "recording.yml",
    """\
Recording rules: the exporter's raw counters and gauges turned into the rates and ratios that the alerts
(alerts.yml) and the Grafana dashboards read. Names follow Prometheus' level:metric:operation convention;
"rank:" series keep job, instance and rank, "gpu:" series keep job, instance, gpu and uuid, "job:" series
keep only job. Windows are 2m so that a 30s scrape interval still gives four samples per window. The ratios'
definitions are trainstack/ratios.py's.""",
    (
        (
            "trainstack-training",
            (
                Record(catalog.RANK_STEPS_RATE, f"rate({catalog.TRAIN_STEPS.name}[{W}])"),
                Record(catalog.RANK_SAMPLES_RATE, f"rate({catalog.TRAIN_SAMPLES.name}[{W}])"),
                Record(catalog.RANK_TOKENS_RATE, f"rate({catalog.TRAIN_TOKENS.name}[{W}])"),
                Record(catalog.JOB_SAMPLES_RATE, f"sum by (job) ({catalog.RANK_SAMPLES_RATE.name})"),
                Record(catalog.JOB_TOKENS_RATE, f"sum by (job) ({catalog.RANK_TOKENS_RATE.name})"),
                Record(
                    catalog.RANK_STEP_DURATION_MEAN,
                    ratios.STEP_SECONDS.promql(),
                    comment="Mean wall time per optimizer step; absent (not NaN) while a rank makes no step.",
                ),
                *quantiles(catalog.RANK_STEP_DURATION_QUANTILE, ""),
                *quantiles(catalog.JOB_STEP_DURATION_QUANTILE, "job, le"),
                Record(
                    catalog.RANK_DATA_WAIT_RATIO,
                    ratios.DATA_WAIT_SHARE.promql(),
                    comment=f"""\
Share of the rank's step time spent blocked on the data loader (a step's wall time includes its wait for
the batch): the time its accelerator had nothing to do because the next batch was not ready. On a GPU rank
both are on the GPU's timeline (its starvation, not the host's wait in next(), which a GPU with queued work
hides: {catalog.TRAIN_HOST_DATA_WAIT.name}); docs/metrics.md. Capped at 1: a wait is counted when it ends, so a
window can catch more of it than of its step.""",
                ),
                Record(catalog.JOB_DATA_WAIT_RATIO, f"avg by (job) ({catalog.RANK_DATA_WAIT_RATIO.name})"),
                Record(
                    catalog.RANK_COMM_EXPOSED_RATIO,
                    ratios.COMM_EXPOSED_SHARE.promql(),
                    comment="""\
Share of the rank's step time it waited at the collectives: DDP's gradient all-reduce after its backward
compute had ended and its buffer broadcast at the start of each forward pass, FSDP's all-gathers and
reduce-scatters where compute waited (trainstack.telemetry.comm). It is the rank's wait for the network and for
slower peers. Absent on ranks that communicate with no other. Capped at 1, as the data-wait ratio is.""",
                ),
                Record(
                    catalog.JOB_COMM_EXPOSED_MIN_RATIO,
                    f"min by (job) ({catalog.RANK_COMM_EXPOSED_RATIO.name})",
                    comment="""\
The least exposed rank: a straggler's peers wait for it at the collectives too, but the straggler
itself does not, so only a slow network makes every rank wait.""",
                ),
                Record(
                    catalog.RANK_TIME_SHARE,
                    ratios.TIME_SHARES.promql(),
                    comment="""\
Where each rank's time goes (trainstack/breakdown.py): each part's share of the rank's time measured in
the window, by `part`: compute, exposed communication, data starvation, host-bound idle, evaluation,
checkpoint save and load, compile, startup. A pause counts when it ends, so a long one shows as a burst.
Progress lost to restarts, and the residual no part accounts for, are known only after the run
(the run summary's time_breakdown, the report).""",
                ),
                Record(
                    catalog.RANK_GOODPUT,
                    f'sum without (part) ({catalog.RANK_TIME_SHARE.name}{{part="{breakdown.COMPUTE}"}})',
                    comment="Goodput: the compute share of the rank's measured time.",
                ),
                Record(catalog.JOB_GOODPUT, f"avg by (job) ({catalog.RANK_GOODPUT.name})"),
                Record(
                    catalog.RANK_HOST_BOUND_RATIO,
                    ratios.HOST_BOUND_SHARE.promql(),
                    comment="""\
Share of the rank's step time its GPU idled although it was neither starved of data nor waiting on
communication: NVML's utilization samples say how long it idled, the starvation measured on its timeline
explains part of it, the rest was the host's (kernel launches, host synchronizations). Absent on ranks
that do not measure it (CPU ranks). Capped at 1, as the data-wait ratio is.""",
                ),
                Record(
                    catalog.RANK_STRAGGLER_WAIT,
                    ratios.STRAGGLER_WAIT.promql(
                        catalog.RANK_COMM_EXPOSED_RATIO.name, catalog.RANK_STEP_DURATION_MEAN.name
                    ),
                    comment="""\
Straggler: every rank of a synchronous job takes the same wall time per step, and a rank slowed anywhere
in its step makes the others wait for it at the next collective (the gradient all-reduce, DDP's buffer
broadcast inside the forward pass), so neither step time nor forward time names it. Per rank: the most
any rank of the job waits a step, less its own wait a step, over the job's longest step (a rank's steps
leave out its pauses, a checkpoint it saves alone, while its peers' steps hold their wait for it); the
straggler waits least, and its figure is what the others wait for it, as a share of step time.""",
                ),
                Record(catalog.JOB_STRAGGLER_WAIT, f"max by (job) ({catalog.RANK_STRAGGLER_WAIT.name})"),
                Record(
                    catalog.JOB_LAST_STEP_AGE,
                    f"time() - max by (job) ({catalog.TRAIN_LAST_STEP.name} > 0)",
                    comment="Seconds since the newest step of any rank in the job; the gauge reads 0 before a rank's "
                    "first step.",
                ),
                Record(catalog.JOB_MFU, f"avg by (job) ({catalog.TRAIN_MFU.name})"),
            ),
        ),
        (
            "trainstack-gpu",
            (
                Record(catalog.GPU_MEMORY_USED_RATIO, ratios.MEMORY_USED_SHARE.promql()),
                Record(catalog.JOB_GPU_UTILIZATION, f"avg by (job) ({catalog.GPU_UTILIZATION.name})"),
                Record(catalog.JOB_GPU_POWER, f"sum by (job) ({catalog.GPU_POWER.name})"),
                Record(
                    catalog.JOB_GPU_ENERGY_RATE,
                    f"sum by (job) (\n  rate({catalog.GPU_ENERGY.name}[{W}])\n"
                    f"  or avg_over_time({catalog.GPU_POWER.name}[{W}])\n)",
                    comment="""\
Joules drawn by all of the job's GPUs per training sample. A GPU without an energy counter (before
Volta) counts with its average power, which is the same quantity in J/s.""",
                ),
                Record(
                    catalog.JOB_GPU_ENERGY_PER_SAMPLE,
                    f"{catalog.JOB_GPU_ENERGY_RATE.name} / ({catalog.JOB_SAMPLES_RATE.name} > 0)",
                ),
                Record(
                    catalog.GPU_THERMAL_THROTTLE,
                    ratios.THERMAL_THROTTLE.promql(),
                    comment="""\
Share of time a GPU's clocks were held down, from NVML's violation counters where the GPU has them,
else from how often the matching clock-event reasons were seen active (trainstack/ratios.py).""",
                ),
                Record(catalog.GPU_POWER_THROTTLE, ratios.POWER_THROTTLE.promql()),
            ),
        ),
    ),
)

T = thresholds
ALERTS = RuleFile(
    "alerts.yml",
    """\
Alert rules: each names the likely reason GPUs sit idle or training is slow, and says what to do about it.
Every alert has a runbook section in docs/alerts.md (runbook_url) and promtool unit tests in
monitoring/prometheus/tests/. The numbers come from trainstack/thresholds.py; docs/alerts.md says how to
change them.""",
    (
        (
            "trainstack-alerts",
            (
                Alert(
                    "TrainstackGPUUnused",
                    f"(\n  {catalog.GPU_UTILIZATION.name} < {T.GPU_IDLE.promql}\n"
                    f"  unless on (job, instance, uuid) {catalog.TRAIN_RANK_INFO.name}\n)\n"
                    f"and on (job) (sum by (job) ({catalog.RANK_STEPS_RATE.name}) > 0)",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} is idle and no rank of the training job uses it",
                    "Likely cause: fewer ranks than GPUs (a plain `python train.py`, DataParallel, or a small "
                    "--nproc-per-node).",
                    fires_when=f"a GPU no rank runs on idles (< {T.GPU_IDLE.percent}) while the job trains",
                    for_="10m",
                ),
                Alert(
                    "TrainstackOneProcessManyGPUs",
                    f"count by (job, instance, pid, process) (\n"
                    f"    {catalog.GPU_PROCESS_MEMORY_USED.name}\n"
                    f"  == on (job, instance, uuid) group_left ()\n"
                    f"    max by (job, instance, uuid) ({catalog.GPU_PROCESS_MEMORY_USED.name})\n"
                    f"  and on (job, instance, uuid)\n"
                    f"    {catalog.GPU_UTILIZATION.name} >= {T.PROCESS_GPU_BUSY.promql}\n"
                    f") >= 2",
                    "warning",
                    "Process {{ $labels.pid }} {{ with $labels.process }}({{ . }}) {{ end }}on "
                    "{{ $labels.instance }} drives {{ $value }} GPUs by itself",
                    "Likely cause: torch.nn.DataParallel, or a model split across GPUs by hand. Either way more GPUs "
                    "add little speed.",
                    fires_when=f"one process is the main memory user of 2 or more GPUs busy >= "
                    f"{T.PROCESS_GPU_BUSY.percent}",
                    for_="10m",
                    comment="A process holds a GPU where it uses the most memory of the processes there: a CUDA context "
                    "a rank left on another rank's GPU holds nothing. Reads NVML's process map alone, so it "
                    "fires for any job, with or without rank telemetry.",
                ),
                Alert(
                    "TrainstackTrainingStalled",
                    f"{catalog.JOB_LAST_STEP_AGE.name} > {T.STALL.promql}",
                    "critical",
                    f"Job {{{{ $labels.job }}}} has made no training step for over {T.STALL.value / 60:g} minutes",
                    "Likely cause: a hang in a collective (one rank crashed or is stuck and the others wait for it), a "
                    "stuck data-loader worker, or a very slow checkpoint write.",
                    fires_when=f"no rank of the job finished a step for {T.STALL.value / 60:g} minutes",
                    for_="1m",
                ),
                Alert(
                    "TrainstackRankHung",
                    f"{catalog.HANG_EVIDENCE.name}\n"
                    f"  > on (job) group_left () max by (job) ({catalog.TRAIN_LAST_STEP.name})\n"
                    f"or {catalog.HANG_EVIDENCE.name} unless on (job) {catalog.TRAIN_LAST_STEP.name}",
                    "critical",
                    "Job {{ $labels.job }} hangs: {{ $labels.headline }}",
                    "Likely cause: the evidence the launcher collected once no rank had stepped for "
                    f"{T.HANG_STEP_MULTIPLE.value:g} median steps, or made its first step in "
                    f"{T.HANG_CEILING.value:g} s, or left its start-up in half the collective timeout (each rank's Python stack and its collectives in flight, in "
                    "RUN_DIR/hang) names rank(s) "
                    "{{ $labels.culprits }}.",
                    fires_when="the launcher collected a stall's evidence after the job's last step, or before its "
                    "first: a hang now, with where each rank waits, minutes before TrainstackTrainingStalled",
                    fix="{{ $labels.fix }} (`trainstack diagnose --run-dir RUN_DIR` has the evidence)",
                ),
                Alert(
                    "TrainstackInputBound",
                    f"{catalog.RANK_DATA_WAIT_RATIO.name} > {T.INPUT_BOUND.promql}",
                    "warning",
                    "Rank {{ $labels.rank }} waits for data {{ $value | humanizePercentage }} of the time",
                    "The rank's accelerator idles while the next batch is prepared, and in DDP every other rank waits "
                    "for it.",
                    fires_when=f"a rank is blocked on its data loader > {T.INPUT_BOUND.percent} of the time",
                    for_="5m",
                ),
                Alert(
                    "TrainstackStragglerRank",
                    f"{catalog.RANK_STRAGGLER_WAIT.name} > {T.STRAGGLER.promql}\n"
                    f"and {catalog.RANK_STRAGGLER_WAIT.name}\n"
                    f"  == on (job) group_left () max by (job) ({catalog.RANK_STRAGGLER_WAIT.name})",
                    "warning",
                    "Rank {{ $labels.rank }} is a straggler: the other ranks wait for it {{ $value | humanizePercentage }} "
                    "of their step time",
                    "Every rank waits for it at the collectives (the gradient all-reduce, DDP's buffer broadcast), so the "
                    "job runs at its speed; it waits least itself. Likely its GPU is throttled or shared, its batches are "
                    "longer or its loader slower, or it does extra work between steps (logging, checkpoints on one rank).",
                    fires_when=f"the other ranks wait at the collectives > {T.STRAGGLER.percent} of their step time beyond "
                    "the least-waiting rank, which is named",
                    for_="10m",
                ),
                Alert(
                    "TrainstackCommunicationBound",
                    f"{catalog.JOB_COMM_EXPOSED_MIN_RATIO.name} > {T.COMM_BOUND.promql}",
                    "warning",
                    "Every rank of job {{ $labels.job }} waits for gradient communication at least "
                    "{{ $value | humanizePercentage }} of its step time",
                    "Backward compute does not hide the gradient all-reduce: the link between the ranks is too slow "
                    "for the gradients (no NVLink or P2P, NCCL over sockets, nodes over Ethernet), so adding ranks adds "
                    "little speed.",
                    fires_when=f"every rank of a job waits for its gradient all-reduce > {T.COMM_BOUND.percent} of "
                    "its step time",
                    for_="10m",
                ),
                Alert(
                    "TrainstackHostBound",
                    f"{catalog.RANK_HOST_BOUND_RATIO.name} > {T.HOST_BOUND.promql}",
                    "warning",
                    "Rank {{ $labels.rank }}'s GPU idles {{ $value | humanizePercentage }} of its step time waiting for "
                    "the host",
                    "The GPU runs out of queued work although it has its next batch and waits on no communication: the "
                    "host launches kernels too slowly (many small kernels, a small batch) or synchronizes with the GPU "
                    "in the loop (.item(), printing tensors).",
                    fires_when=f"a rank's GPU idles, neither starved nor waiting on communication, > "
                    f"{T.HOST_BOUND.percent} of its step time",
                    for_="10m",
                ),
                Alert(
                    "TrainstackGPUUnderused",
                    f"avg_over_time({catalog.GPU_UTILIZATION.name}[5m]) >= {T.GPU_UNDERUSED_UTILIZATION.promql}\n"
                    "and on (job, instance, gpu, uuid)\n"
                    f"avg_over_time({catalog.GPU_SM_ACTIVE.name}[5m]) < {T.GPU_UNDERUSED_SM_ACTIVE.promql}",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} reads busy but under "
                    f"{T.GPU_UNDERUSED_SM_ACTIVE.percent} of its SMs work",
                    "NVML's utilization counts the time any kernel runs, so a kernel on a few SMs reads 100%; GPM's SM "
                    "activity says most of this GPU's SMs idle. Likely cause: too little work per kernel (a per-GPU batch "
                    "too small to fill the SMs, a chain of tiny kernels, fp32 math).",
                    fires_when=f"a GPU reads busy (utilization >= {T.GPU_UNDERUSED_UTILIZATION.percent}) while under "
                    f"{T.GPU_UNDERUSED_SM_ACTIVE.percent} of its SMs work (GPM)",
                    for_="10m",
                    fix="a larger per-GPU batch (less gradient accumulation for the same global batch), bf16 autocast "
                    "(--mixed-precision bf16), --compile or CUDA graphs, fused optimizers; `trainstack diagnose` shows "
                    "the ranks' batch, precision and compile setting beside the figures",
                    comment="GPM (Hopper and newer): absent on older GPUs, where this alert cannot fire. Both figures "
                    "averaged over 5m: the gauges are each sampling period's mean, and a scrape sees one period "
                    "in many.",
                ),
                Alert(
                    "TrainstackNoTensorCores",
                    f"avg_over_time({catalog.GPU_SM_ACTIVE.name}[5m]) >= {T.NO_TENSOR_SM_ACTIVE.promql}\n"
                    "and on (job, instance, gpu, uuid)\n"
                    f"avg_over_time({catalog.GPU_TENSOR_ACTIVE.name}[5m]) < {T.NO_TENSOR_ACTIVE.promql}",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} works without its tensor cores",
                    "The SMs are busy but the tensor cores stay idle: the matmuls run on the plain fp32 units, which is "
                    "what fp32 training without TF32 does, at a fraction of the tensor cores' speed.",
                    fires_when=f"a GPU's SMs work (>= {T.NO_TENSOR_SM_ACTIVE.percent} active) while its tensor cores run "
                    f"< {T.NO_TENSOR_ACTIVE.percent} of the time (GPM)",
                    for_="10m",
                ),
                Alert(
                    "TrainstackGPUThermalThrottling",
                    f"{catalog.GPU_THERMAL_THROTTLE.name} > {T.THERMAL_THROTTLE.promql}",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} is thermally throttled "
                    "{{ $value | humanizePercentage }} of the time",
                    "The GPU lowers its clocks because it is too hot, so its rank computes slower and holds up the job.",
                    fires_when=f"a GPU's clocks are held down by temperature > {T.THERMAL_THROTTLE.percent} of the time",
                    for_="5m",
                ),
                Alert(
                    "TrainstackGPUPowerThrottling",
                    f"{catalog.GPU_POWER_THROTTLE.name} > {T.POWER_THROTTLE.promql}\n"
                    "and on (job, instance, gpu, uuid)\n"
                    f"(avg_over_time({catalog.GPU_SM_CLOCK.name}[5m]) < {T.POWER_THROTTLE_CLOCK.promql} * "
                    f"{catalog.GPU_SM_CLOCK_MAX.name})",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} is power-capped {{ $value | humanizePercentage }} "
                    "of the time",
                    f"Its power limit holds the SM clock under {T.POWER_THROTTLE_CLOCK.percent} of its maximum, "
                    "usually because the limit was lowered (nvidia-smi -pl, a node power policy) or the power supply "
                    "asserts a power brake.",
                    fires_when=f"a GPU is power-capped > {T.POWER_THROTTLE.percent} of the time"
                    f" with its SM clock under {T.POWER_THROTTLE_CLOCK.percent} of max",
                    for_="15m",
                    comment="Touching the power cap now and then is normal at full load; held at the cap with the SM "
                    "clock far below its maximum is not.",
                ),
                Alert(
                    "TrainstackGPUMemoryNearlyFull",
                    f"{catalog.GPU_MEMORY_USED_RATIO.name} > {T.MEMORY_FULL.promql}",
                    "warning",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} memory is {{ $value | humanizePercentage }} full",
                    "A longer batch or fragmentation will end in CUDA out of memory.",
                    fires_when=f"a GPU's memory is > {T.MEMORY_FULL.percent} used",
                    for_="5m",
                ),
                Alert(
                    "TrainstackGPUXidError",
                    f"increase({catalog.GPU_XID_ERRORS.name}[10m]) > 0\n"
                    f"or ({catalog.GPU_XID_ERRORS.name} > 0 unless {catalog.GPU_XID_ERRORS.name} offset 10m)",
                    "critical",
                    "GPU {{ $labels.gpu }} on {{ $labels.instance }} reported XID {{ $labels.xid }}",
                    "The driver reported a GPU fault: 13/31/43 usually come from the program, 48/63/64/94/95 are memory "
                    "ECC faults, 74 NVLink, 79 a GPU fallen off the bus.",
                    fires_when="the driver reported a new XID error on a GPU",
                    comment="A counter series appears with its first error, so a new series counts as an increase too.",
                ),
                Alert(
                    "TrainstackExporterDown",
                    'up{job=~".*trainstack.*"} == 0',
                    "warning",
                    "The trainstack exporter on {{ $labels.instance }} does not answer",
                    "Expected once a run has finished (the launcher stops the exporter with the ranks); otherwise the "
                    "trainer container or pod is gone or the exporter port is not reachable.",
                    fires_when="Prometheus cannot scrape a trainstack exporter",
                    for_="2m",
                ),
                Alert(
                    "TrainstackNVMLUnavailable",
                    f"{catalog.EXPORTER_NVML_UP.name} == 0\n"
                    f'and on (job, instance) (count by (job, instance) ({catalog.TRAIN_RANK_INFO.name}{{uuid!=""}}) > 0)',
                    "warning",
                    "The exporter on {{ $labels.instance }} cannot read the GPUs its ranks train on",
                    "The exporter runs without access to the GPUs (no GPU reservation for its container, "
                    "NVIDIA_VISIBLE_DEVICES unset) or without libnvidia-ml, so GPU metrics and XID errors are missing.",
                    fires_when="ranks run on GPUs but the exporter cannot read NVML",
                    for_="5m",
                ),
                Alert(
                    "TrainstackGPUDataStale",
                    f"{catalog.EXPORTER_GPU_SAMPLE_AGE.name}\n> {T.GPU_SAMPLE_STALE.promql} * "
                    f"{catalog.EXPORTER_GPU_SAMPLE_INTERVAL.name}",
                    "warning",
                    f"The exporter on {{{{ $labels.instance }}}} serves {{{{ $labels.cadence }}}} GPU data older than "
                    f"{T.GPU_SAMPLE_STALE.promql} sampling intervals",
                    f"The exporter's GPU sampler has not finished a sample for {T.GPU_SAMPLE_STALE.promql} of its "
                    "intervals, so every GPU metric (cadence fast) or the energy, throttling, PCIe replay, ECC and NVLink "
                    "counters (cadence slow) show old values. Likely cause: an NVML call hangs in the driver (a GPU in a "
                    "bad state, a driver upgrade or reload in progress) or the host is starved of CPU.",
                    fires_when=f"the exporter's GPU sample is older than {T.GPU_SAMPLE_STALE.promql}"
                    f" of its sampling intervals",
                    for_="1m",
                ),
            ),
        ),
    ),
)

RULE_FILES = (RECORDING, ALERTS)


class Prose(str):
    """Text a reader reads (an alert's description): written as a folded `>` block, wrapped to the file's width."""


class Quoted(str):
    """A one-line text with template braces (an alert's summary): double-quoted, as Prometheus' examples write it."""


class _Dumper(yaml.SafeDumper):
    """PromQL over several lines as a `|` block, prose folded, other strings double-quoted on one line (the
    templates in summaries read best unbroken): the file reads like a hand-written one."""

    def write_double_quoted(self, text, split=True):
        super().write_double_quoted(text, split=False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = ">" if isinstance(value, Prose) else "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_quoted(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(Prose, _represent_str)
_Dumper.add_representer(Quoted, _represent_quoted)


def _rule(rule: Record | Alert) -> dict:
    if isinstance(rule, Record):
        return {"record": rule.series.name, "expr": rule.expr, **({"labels": dict(rule.labels)} if rule.labels else {})}
    return {
        "alert": rule.name,
        "expr": rule.expr,
        **({"for": rule.for_} if rule.for_ else {}),
        "labels": {"severity": rule.severity},
        "annotations": {
            "summary": Quoted(rule.summary),
            "description": Prose(rule.description),
            "runbook_url": f"docs/alerts.md#{rule.name.lower()}",
        },
    }


def _comment(text: str, indent: str) -> str:
    lines = textwrap.wrap(" ".join(text.split()), WIDTH - len(indent) - 2)
    return "".join(f"{indent}# {line}\n" for line in lines)


def rule_file_text(rule_file: RuleFile) -> str:
    text = f"# Generated by monitoring/prometheus/build_rules.py: do not edit.\n#\n{_comment(rule_file.header, '')}"
    text += "groups:\n"
    for name, rules in rule_file.groups:
        text += f"  - name: {name}\n    rules:\n"
        for index, rule in enumerate(rules):
            if index and (rule.comment or isinstance(rule, Alert)):
                text += "\n"
            # PyYAML breaks a folded line at the first space past its width: leave room for the longest word
            dumped = yaml.dump([_rule(rule)], Dumper=_Dumper, sort_keys=False, width=WIDTH - 30, allow_unicode=True)
            text += _comment(rule.comment, " " * 6) + "".join(f"      {line}\n" for line in dumped.splitlines())
    return text


def alerts_markdown() -> str:
    lines = ["| alert | severity | fires when | for |", "| --- | --- | --- | --- |"]
    lines += [
        f"| [{a.name}](#{a.name.lower()}) | {a.severity} | {a.fires_when} | {a.for_ or 0} |"
        for _, rules in ALERTS.groups
        for a in rules
        if isinstance(a, Alert)  # all of them: the alert file's groups hold no recording rule
    ]
    lines += [
        "",
        "The thresholds (`trainstack/thresholds.py`; `trainstack diagnose` applies the same ones):",
        "",
        "| threshold | value | unit | a problem when | alert |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{t.name}` | {t.promql} | {t.unit} | {t.meaning} | "
        f"{f'[{t.alert}](#{t.alert.lower()})' if t.alert else 'none: diagnose only'} |"
        for t in thresholds.THRESHOLDS
    ]
    return "\n".join(lines) + "\n"


def verdicts_markdown() -> str:
    """docs/diagnostics.md's table of the verdicts diagnose gives, in its order, with the alerts of each."""
    lines = ["| verdict | when | alert |", "| --- | --- | --- |"]
    lines += [
        f"| `{p.kind}` | {p.when} | {', '.join(p.alerts) or '-'} |" for p in problems.PROBLEMS.values() if p.detection
    ]
    return "\n".join(lines) + "\n"


def spliced(path: Path, name: str, table: str) -> str:
    """The doc with `table` between its markers for `name`."""
    begin, end = (
        f"<!-- {name}: generated by monitoring/prometheus/build_rules.py, do not edit -->",
        f"<!-- end of {name} -->",
    )
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path.relative_to(ROOT)} lacks the markers {begin!r} ... {end!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}{end}{tail}"


def docs_texts() -> dict[Path, str]:
    verdicts_docs = DOCS_FILE.with_name(VERDICTS_DOCS)
    return {
        DOCS_FILE: spliced(DOCS_FILE, "alerts", alerts_markdown()),
        verdicts_docs: spliced(verdicts_docs, "verdicts", verdicts_markdown()),
    }


def main(argv: list[str] | None = None) -> int:
    return write_or_check(
        __doc__.split("\n\n")[0],
        lambda: {**{RULES_DIR / f.name: rule_file_text(f) for f in RULE_FILES}, **docs_texts()},
        ROOT,
        "python monitoring/prometheus/build_rules.py",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
