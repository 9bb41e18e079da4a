"""The ratios trainstack judges a run by, each defined once: what is divided by what, and how.

The recording rules take their PromQL from these definitions (monitoring/prometheus/build_rules.py), and every
other place that computes the same figure applies the same arithmetic through them: `trainstack diagnose` on rates
it reads from an exporter or Prometheus (monitoring/diagnose/snapshot.py), the report on a run's telemetry records
(monitoring/report/runfiles.py), and each rank for its progress bar (trainstack/telemetry/). The rank cannot
import monitoring code and the rules cannot import Python at all, so the definitions live here, next to the
metric catalog whose names they divide.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from trainstack import breakdown, catalog

WINDOW = "2m"
"""The recording rules' rate() range: a 30s scrape interval still gives four samples per window."""


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator: of two counters' rates over one window (so that neither a run younger than the
    window nor a pause dilutes it), or of two gauges. Undefined while the denominator is not positive."""

    numerator: str
    denominator: str
    meaning: str
    counters: bool = True
    """Both are counters: their rates over the window are divided; else two gauges' current values."""
    at_most: float | None = None
    """A share counted when its span ends can exceed the whole in a window that catches more of it: capped."""
    numerator_labels: tuple[tuple[str, str], ...] = ()
    """(label, value) pairs: the numerator counts only the series with these labels (one part of a counter split by
    a label), and those labels are summed away before the division."""

    @property
    def series(self) -> tuple[str, ...]:
        return self.numerator, self.denominator

    def counts(self, labels: dict[str, str]) -> bool:
        """Whether a numerator series with these labels counts."""
        return all(labels.get(label) == value for label, value in self.numerator_labels)

    def of(self, numerator: float, denominator: float) -> float | None:
        if not denominator > 0:
            return None
        ratio = numerator / denominator
        return ratio if self.at_most is None else min(self.at_most, ratio)

    def promql(self, window: str = WINDOW) -> str:
        def term(series: str) -> str:
            return f"rate({series}[{window}])" if self.counters else series

        numerator = term(self.numerator)
        if self.numerator_labels:
            matchers = ", ".join(f'{label}="{value}"' for label, value in self.numerator_labels)
            labels = ", ".join(label for label, _ in self.numerator_labels)
            numerator = f"sum without ({labels}) ({term(f'{self.numerator}{{{matchers}}}')})"
        ratio = f"{numerator}\n/ ({term(self.denominator)} > 0)"
        return ratio if self.at_most is None else f"clamp_max(\n{textwrap.indent(ratio, '  ')},\n  {self.at_most:g}\n)"


STEP_SECONDS = Ratio(
    catalog.TRAIN_STEP_DURATION.sample("sum"),
    catalog.TRAIN_STEP_DURATION.sample("count"),
    "mean wall time per optimizer step",
)
DATA_WAIT_SHARE = Ratio(
    catalog.TRAIN_DATA_WAIT.name,
    catalog.TRAIN_STEP_DURATION.sample("sum"),
    "share of the rank's step time its device sat idle for want of the next batch (a step's time includes its "
    "wait for the batch); on a GPU rank both on the GPU's timeline",
    at_most=1.0,
)
HOST_DATA_WAIT_SHARE = Ratio(
    catalog.TRAIN_HOST_DATA_WAIT.name,
    catalog.TRAIN_STEP_DURATION.sample("sum"),
    "share of the rank's step time its host spent blocked in the loader's next()",
    at_most=1.0,
)
COMM_EXPOSED_SHARE = Ratio(
    catalog.TRAIN_COMM_EXPOSED.name,
    catalog.TRAIN_STEP_DURATION.sample("sum"),
    "share of the rank's step time it waited for communication compute did not hide",
    at_most=1.0,
)
HOST_BOUND_SHARE = Ratio(
    catalog.TRAIN_TIME.name,
    catalog.TRAIN_STEP_DURATION.sample("sum"),
    "share of the rank's step time its GPU idled although neither starved of data nor waiting on communication "
    "(trainstack/breakdown.py), both on the GPU's timeline",
    at_most=1.0,
    numerator_labels=(("part", breakdown.HOST_BOUND),),
)
COMM_SECONDS = Ratio(
    catalog.TRAIN_COMM_SECONDS.name,
    catalog.TRAIN_STEPS.name,
    "communication per optimizer step, while at least one collective was in flight, hidden or not",
)
COMM_BYTES_PER_STEP = Ratio(
    catalog.TRAIN_COMM_BYTES.name, catalog.TRAIN_STEPS.name, "bytes of the rank's collectives per optimizer step"
)
FORWARD_SECONDS = Ratio(
    catalog.TRAIN_FORWARD_SECONDS.name,
    catalog.TRAIN_STEPS.name,
    "mean forward-pass time per optimizer step, less its waits for collectives (DDP's buffer broadcast, FSDP's "
    "all-gathers): which part of a straggler's step is slow",
)
MEMORY_USED_SHARE = Ratio(
    catalog.GPU_MEMORY_USED.name, catalog.GPU_MEMORY_TOTAL.name, "used over installed device memory", counters=False
)
SM_CLOCK_SHARE = Ratio(
    catalog.GPU_SM_CLOCK.name,
    catalog.GPU_SM_CLOCK_MAX.name,
    "the SM clock over its maximum (the power-throttling alert compares its 5m average)",
    counters=False,
)


@dataclass(frozen=True)
class Shares:
    """Each series' share of the sum of its group, of one counter split by a label: rates over one window."""

    counter: str
    label: str
    meaning: str

    def promql(self, window: str = WINDOW) -> str:
        rate = f"rate({self.counter}[{window}])"
        return f"{rate}\n/ ignoring ({self.label}) group_left ()\n(sum without ({self.label}) ({rate}) > 0)"


TIME_SHARES = Shares(
    catalog.TRAIN_TIME.name,
    "part",
    "each part's share of the rank's time measured in the window (trainstack/breakdown.py); the compute share is the "
    "rank's goodput. Lost progress and the residual are known only after the run (the run summary, the report)",
)


@dataclass(frozen=True)
class WaitBeyond:
    """Per member of a group: the most any member waits a step, less its own wait a step, as a share of the group's
    longest step. Each member's wait comes as a share of its own step time, and a member's steps leave out its pauses
    (trainstack/breakdown.py) while its peers' steps hold their waits for them: a rank that saves a checkpoint alone
    has shorter steps than the peers that wait for it, so shares of their unequal steps do not subtract. Where the
    steps are equal, as a synchronous job's are otherwise, it is the most share less the member's own. The member that
    waits least has the largest figure, what the others wait beyond it; undefined for a group of one."""

    group: str
    """The label the group shares (PromQL); in Python the waits passed in are one group."""
    meaning: str

    def of(self, waits: dict[str, float], step_seconds: dict[str, float]) -> dict[str, float]:
        """`waits`: each member's share of its step time; `step_seconds`: each member's mean step (a member without
        one is left out)."""
        per_step = {key: share * step_seconds[key] for key, share in waits.items() if step_seconds.get(key)}
        if len(per_step) < 2:
            return {}
        most, longest = max(per_step.values()), max(step_seconds[key] for key in per_step)
        return {key: (most - wait) / longest for key, wait in per_step.items()}

    def promql(self, waits: str, step_seconds: str) -> str:
        per_step = f"({waits} * {step_seconds})"
        group = self.group
        return (
            f"(\n  max by ({group}) {per_step}\n  - on ({group}) group_right ()\n  {per_step}\n)\n"
            f"/ on ({group}) group_left ()\nmax by ({group}) ({step_seconds})"
        )


STRAGGLER_WAIT = WaitBeyond(
    "job",
    "the most any rank of the job waits at its collectives (COMM_EXPOSED_SHARE: DDP's gradient all-reduce "
    "and buffer broadcast, FSDP's all-gathers and reduce-scatters, every other collective the rank calls), less "
    "this rank's own wait. Every rank of a "
    "synchronous job takes the same wall time per step, so a rank slowed anywhere in its step (data, forward, "
    "backward, optimizer, logging, a pause it takes alone) makes the others wait for it at the next collective and "
    "itself waits least: its figure is what it costs them, as a share of the longest step",
)


@dataclass(frozen=True)
class Throttle:
    """Share of time a GPU's clocks were held down for one cause: the rate of NVML's violation counter where the
    GPU has one, else how often one of the matching clock-event reasons was seen active."""

    violation_counter: str
    reasons: tuple[str, ...]

    @property
    def series(self) -> tuple[str, ...]:
        return self.violation_counter, catalog.GPU_CLOCK_EVENT_ACTIVE.name

    def of(self, violation_rate: float | None, active_reasons: set[str] | None) -> float | None:
        """Diagnose's single reading: the counter's rate, else 1 or 0 from whether a matching reason is active."""
        if violation_rate is not None:
            return violation_rate
        if active_reasons is not None:
            return float(bool(active_reasons & set(self.reasons)))
        return None

    def promql(self, window: str = WINDOW) -> str:
        active = f'{catalog.GPU_CLOCK_EVENT_ACTIVE.name}{{reason=~"{"|".join(self.reasons)}"}}'
        return (
            f"rate({self.violation_counter}[{window}])\nor max without (reason) (avg_over_time(\n  {active}[{window}]))"
        )


# hw_slowdown counts as thermal: NVML raises it for overheating, a power brake or over-current, and overheating is
# the usual one.
THERMAL_THROTTLE = Throttle(
    catalog.GPU_THERMAL_VIOLATION.name, ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown")
)
POWER_THROTTLE = Throttle(catalog.GPU_POWER_VIOLATION.name, ("sw_power_cap", "hw_power_brake_slowdown"))
