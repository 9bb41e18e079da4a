"""How a run would scale: its step time and efficiency at other world sizes and link speeds, from its own figures.

The model, printed beside the numbers:
- compute, data starvation and host-bound time per step stay what the run measured (weak scaling: the per-device
  batch is fixed, so each device's work per step does not change);
- the gradients are all-reduced with a ring: each rank sends and receives 2(n-1)/n of the gradient bytes per step, so
  communication takes 2(n-1)/n x bytes / bus bandwidth (NCCL's "busbw", the link's own speed);
- the run hid a share h of its communication behind backward compute; that share stays hidden at every size:
  exposed = (1 - h) x communication;
- efficiency is the one-device step time (no communication) over the predicted step time.

The bandwidth is the run's achieved bus bandwidth (bytes x 2(n-1)/n over its communication time), or one the user
gives (--bandwidth). Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainstack import breakdown, window
from trainstack.errors import ConfigError
from trainstack.record import IntervalRecord
from trainstack.rundir import SHOWN, RunDir, read_summary


def ring_factor(world_size: int) -> float:
    """The share of the gradient bytes each rank sends (and receives) in a ring all-reduce: 2(n-1)/n."""
    return 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class RunFigures:
    """Per step, the ranks' mean over their steady windows (trainstack/record.py)."""

    world_size: int
    compute_seconds: float
    """Every step part but exposed communication: compute, data starvation, host-bound idle."""
    comm_seconds: float
    exposed_seconds: float
    gradient_bytes: float

    def __post_init__(self) -> None:
        if self.world_size < 2 or self.comm_seconds <= 0 or self.gradient_bytes <= 0:
            raise ConfigError(
                "the run measured no gradient communication (one rank, or records without "
                "comm_seconds/comm_bytes): nothing to scale from; run it on 2 or more ranks"
            )

    @property
    def hidden_share(self) -> float:
        return max(0.0, min(1.0, 1 - self.exposed_seconds / self.comm_seconds))

    @property
    def bus_bytes_per_second(self) -> float:
        return self.gradient_bytes * ring_factor(self.world_size) / self.comm_seconds


def figures_of(run_dir: Path) -> RunFigures:
    records = {
        steady.rank: lines
        for steady in window.of_run(run_dir)
        if (lines := [r for r in steady.records if r.comm_bytes is not None])
    }
    if not records:
        raise ConfigError(
            f"{run_dir} has no telemetry records past the warm-up ({SHOWN.rank_records('<r>')}): "
            "pass the directory of a finished run of 2 or more ranks"
        )

    def per_step(key: Callable[[IntervalRecord], float]) -> float:
        return sum(
            sum(key(r) for r in lines) / sum(r.step_count or 0 for r in lines) for lines in records.values()
        ) / len(records)

    world = read_summary(RunDir(run_dir).summary).get("world_size") or len(records)
    return RunFigures(
        world_size=world,
        compute_seconds=per_step(
            lambda r: sum(
                v
                for part, v in (r.time_parts or {}).items()
                if part in breakdown.STEP_PARTS and part != breakdown.COMM_EXPOSED
            )
        ),
        comm_seconds=per_step(lambda r: r.comm_seconds or 0.0),
        exposed_seconds=per_step(lambda r: r.comm_exposed_seconds or 0.0),
        gradient_bytes=per_step(lambda r: r.comm_bytes or 0),
    )


@dataclass(frozen=True)
class Prediction:
    world_size: int
    bus_bytes_per_second: float
    step_seconds: float
    exposed_seconds: float
    efficiency: float


def predict(run: RunFigures, world_size: int, bus_bytes_per_second: float | None = None) -> Prediction:
    bandwidth = bus_bytes_per_second or run.bus_bytes_per_second
    comm = ring_factor(world_size) * run.gradient_bytes / bandwidth if world_size > 1 else 0.0
    exposed = (1 - run.hidden_share) * comm
    step = run.compute_seconds + exposed
    return Prediction(world_size, bandwidth, step, exposed, run.compute_seconds / step)


def table(run: RunFigures, predictions: list[Prediction], given: bool) -> str:
    source = "given (--bandwidth)" if given else "the run's achieved bus bandwidth"
    lines = [
        f"measured on {run.world_size} ranks: {1000 * (run.compute_seconds + run.exposed_seconds):.1f} ms per "
        f"step: {1000 * run.compute_seconds:.1f} ms compute, data wait and host time, "
        f"{1000 * run.comm_seconds:.1f} ms communication of which {100 * run.hidden_share:.0f}% hidden; "
        f"{run.gradient_bytes / 1e6:.2f} MB of gradients per step at {8 * run.bus_bytes_per_second / 1e9:.3f} "
        "Gbit/s bus bandwidth",
        f"{'ranks':>6} {'bus Gbit/s':>11} {'step ms':>9} {'exposed ms':>11} {'efficiency':>11}",
    ]
    lines += [
        f"{p.world_size:>6} {8 * p.bus_bytes_per_second / 1e9:>11.3f} {1000 * p.step_seconds:>9.1f} "
        f"{1000 * p.exposed_seconds:>11.1f} {100 * p.efficiency:>10.0f}%"
        for p in predictions
    ]
    lines.append(
        f"model: weak scaling (per-device batch fixed; compute per step as measured); ring all-reduce, "
        f"2(n-1)/n x gradient bytes over the bus bandwidth ({source}); the share of communication hidden "
        "behind backward stays as measured; efficiency = step time without communication / predicted"
    )
    return "\n".join(lines)
