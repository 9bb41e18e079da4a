"""The report's figures, one function each, drawn with matplotlib's object API (no pyplot global state, Agg)."""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from trainstack import breakdown, thresholds
from trainstack.monitoring.report.runfiles import (
    RunFiles,
    data_wait_ratio,
    on_gpu_clock,
    pauses,
    training_seconds,
)

GiB = 1 << 30


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(10, 3.8), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    return figure, axes


def _legend(axes, count: int) -> None:
    axes.legend(fontsize="small", ncols=max(1, count // 8), loc="best")


def _per_rank(draw: Callable[[RunFiles], Figure | None]) -> Callable[[RunFiles], Figure | None]:
    """A figure of the ranks' records, left out of a run that has none (a watched command not instrumented)."""
    return lambda run: draw(run) if run.ranks else None


def loss(run: RunFiles) -> Figure:
    # Each rank's own loss: ranks that disagree for long train on data that differs (a sampler left out, a
    # per-rank shard). A loop that gives its monitor no loss has gaps.
    figure, axes = _figure("Training loss per rank", "step", "loss")
    lines = 0
    for rank, launches in sorted(run.launches.items()):
        segments = [launch.records for launch in launches if launch.records]
        for number, records in enumerate(segments, start=1):
            # one line per launch: a resumed run retrains the steps its killed launch lost
            label = f"rank {rank}" + (f", segment {number}" if len(segments) > 1 else "")
            axes.plot(
                [r.step for r in records],
                [math.nan if r.loss is None else r.loss for r in records],
                marker=".",
                label=label,
            )
            lines += 1
    _legend(axes, lines)
    return figure


def throughput(run: RunFiles) -> Figure:
    """Samples over training time: an interval's pauses (evaluation, a checkpoint save) are left out of its rate,
    so they show as the marked pauses they are, not as dips."""
    figure, axes = _figure("Throughput per rank (over training time; dotted: pauses)", "step", "samples / s")
    for rank, records in run.ranks.items():
        axes.plot(
            [r.step for r in records],
            [r.samples / seconds if (seconds := training_seconds(r)) > 0 else math.nan for r in records],
            marker=".",
            label=f"rank {rank}",
        )
    first_rank = run.ranks[min(run.ranks)]
    marked = sorted({pause for record in first_rank for pause in pauses(record) if pause[1] != breakdown.STARTUP})
    for step, part in marked:
        axes.axvline(step, color="grey", linestyle=":", alpha=0.7)
        axes.annotate(
            part,
            (step, 0),
            xytext=(2, 2),
            textcoords="offset points",
            rotation=90,
            fontsize="x-small",
            color="grey",
            va="bottom",
        )
    axes.set_ylim(bottom=0)
    _legend(axes, len(run.ranks))
    return figure


def step_times(run: RunFiles) -> Figure:
    figure, axes = _figure("Step time distribution per rank", "rank", "step time (ms)")
    ranks = list(run.ranks)
    durations = [[1000 * s for r in run.ranks[rank] for s in r.step_seconds] or [0.0] for rank in ranks]
    axes.boxplot(durations, tick_labels=[str(rank) for rank in ranks], showfliers=True, widths=0.6)
    axes.set_ylim(bottom=0)
    for position, values in enumerate(durations, start=1):
        axes.annotate(
            f"{statistics.median(values):.0f}",
            (position, statistics.median(values)),
            textcoords="offset points",
            xytext=(18, 0),
            fontsize="small",
            va="center",
        )
    return figure


def data_wait(run: RunFiles) -> Figure:
    if any(on_gpu_clock(records) for records in run.ranks.values()):
        title = "Data-wait ratio per rank (GPU idle for want of a batch / step time, on the GPU's timeline)"
    else:
        title = "Data-wait ratio per rank (time blocked on the loader / step time)"
    figure, axes = _figure(title, "step", "ratio")
    for rank, records in run.ranks.items():
        axes.plot(
            [r.step for r in records],
            [math.nan if (ratio := data_wait_ratio(r)) is None else ratio for r in records],
            marker=".",
            label=f"rank {rank}",
        )
    axes.axhline(thresholds.INPUT_BOUND.value, color="tab:red", linestyle="--", label="input-bound threshold")
    axes.set_ylim(0, 1)
    _legend(axes, len(run.ranks) + 1)
    return figure


def _gpu_series(snapshots: list[dict], field: str, start: float, unit: float = 1.0):
    """Seconds since start and values; a field NVML does not support on that GPU is null, so it is skipped."""
    points = [(s["time"] - start, s[field] / unit) for s in snapshots if s.get(field) is not None]
    return [t for t, _ in points], [v for _, v in points]


def gpu_utilization(run: RunFiles) -> Figure | None:
    if not run.gpus:
        return None
    start = run.start_time
    figure, axes = _figure("GPU utilization (share of time a kernel ran)", "seconds since start", "ratio")
    for (index, _uuid), snapshots in run.gpus.items():
        axes.plot(*_gpu_series(snapshots, "utilization_ratio", start), label=f"GPU {index}")
    axes.set_ylim(0, 1.05)
    _legend(axes, len(run.gpus))
    return figure


def gpu_memory(run: RunFiles) -> Figure | None:
    if not run.gpus:
        return None
    start = run.start_time
    figure, axes = _figure("GPU memory used (dashed: total)", "seconds since start", "GiB")
    for (index, _uuid), snapshots in run.gpus.items():
        (line,) = axes.plot(*_gpu_series(snapshots, "memory_used_bytes", start, GiB), label=f"GPU {index}")
        totals = _gpu_series(snapshots, "memory_total_bytes", start, GiB)[1]
        if totals:
            axes.axhline(max(totals), color=line.get_color(), linestyle="--", alpha=0.5)
    axes.set_ylim(bottom=0)
    _legend(axes, len(run.gpus))
    return figure


def time_breakdown(run: RunFiles) -> Figure | None:
    """A stacked bar per rank (all its launches) and per launch (all ranks): where the wall time went."""
    times = run.time_breakdown
    if times is None:
        return None
    bars = max(len(times["ranks"]), len(times["segments"]))
    figure = Figure(figsize=(10, max(3.8, 1.6 + 0.4 * bars)), dpi=100, layout="constrained")
    figure.suptitle(f"Where the time went (goodput {100 * (times['goodput'] or 0):.0f}%: compute over wall time)")
    shown = [part for part in times["parts"] if any(abs(r["seconds"][part]) > 0 for r in times["ranks"])]
    # tab20 is a ListedColormap, whose colors the registry's type for it (Colormap) does not have
    palette: tuple[tuple[float, float, float], ...] = colormaps["tab20"].colors  # type: ignore[attr-defined]
    colors = dict(zip(times["parts"], palette, strict=False))
    panels = (
        ([f"rank {r['rank']}" for r in times["ranks"]], times["ranks"], "per rank, every launch"),
        ([f"launch {s['segment'] + 1}" for s in times["segments"]], times["segments"], "per launch, every rank"),
    )
    for axes, (labels, rows, title) in zip(figure.subplots(1, 2), panels, strict=True):
        left = [0.0] * len(rows)
        for part in shown:
            widths = [max(row["seconds"][part], 0.0) for row in rows]
            axes.barh(labels, widths, left=left, color=colors[part], label=part)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        axes.set_title(title)
        axes.set_xlabel("seconds")
        axes.invert_yaxis()
    figure.legend(
        *figure.axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(shown), 6),
        fontsize="small",
    )
    return figure


@dataclass(frozen=True)
class FigureSpec:
    id: str
    draw: Callable[[RunFiles], Figure | None]


FIGURES = (
    FigureSpec("loss", _per_rank(loss)),
    FigureSpec("throughput", _per_rank(throughput)),
    FigureSpec("step-time", _per_rank(step_times)),
    FigureSpec("data-wait", _per_rank(data_wait)),
    FigureSpec("time-breakdown", _per_rank(time_breakdown)),
    FigureSpec("gpu-utilization", gpu_utilization),
    FigureSpec("gpu-memory", gpu_memory),
)


def png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
