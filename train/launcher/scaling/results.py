"""The benchmark's answer: samples/s, speed-up and scaling efficiency per mode and device count, as a table,
JSON and a plot. Both modes are measured against one baseline, DDP's smallest device count, per device."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from trainstack.train.launcher.scaling.runs import Measurement

NO_DATAPARALLEL = (
    "nn.DataParallel comparison needs GPUs: it splits each batch across CUDA devices inside one "
    "process, and this host has none"
)


def _per_device_baseline(measurements: list[Measurement]) -> float:
    base = min((m for m in measurements if m.mode == "DDP"), key=lambda m: m.devices)
    return base.samples_per_second / base.devices


def rows(measurements: list[Measurement]) -> list[dict]:
    per_device = _per_device_baseline(measurements)
    return [
        {
            **asdict(m),
            "speedup": m.samples_per_second / per_device,
            "efficiency": m.samples_per_second / (m.devices * per_device),
        }
        for m in measurements
    ]


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def table(measurements: list[Measurement], gpus: int) -> str:
    unit = "GPUs" if gpus else "CPU ranks"
    lines = [f"{'mode':<13} {unit:>9} {'samples/s':>10} {'speed-up':>9} {'efficiency':>10} {'exposed comm':>12}"]
    for row in rows(measurements):
        lines.append(
            f"{row['mode']:<13} {row['devices']:>9} {row['samples_per_second']:>10.1f} "
            f"{row['speedup']:>8.2f}x {100 * row['efficiency']:>9.0f}% "
            f"{_percent(row['exposed_comm_share']):>12}"
        )
    if not gpus:
        lines.append(NO_DATAPARALLEL)
    lines.append("speed-up and efficiency: against DDP on the fewest devices, per device (efficiency 100% = linear)")
    lines.append(
        "exposed comm: the share of step time the least exposed rank waited for communication compute did "
        "not hide\n(docs/metrics.md); - where nothing communicated (one device) or nothing measured it"
    )
    return "\n".join(lines)


def write_json(measurements: list[Measurement], gpus: int, path: Path) -> None:
    path.write_text(json.dumps({"gpus": gpus, "results": rows(measurements)}, indent=2) + "\n")


def plot(measurements: list[Measurement], gpus: int, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    per_device = _per_device_baseline(measurements)
    counts = sorted({m.devices for m in measurements})
    axes.plot(counts, [per_device * n for n in counts], linestyle="--", color="grey", label="linear scaling")
    for mode, marker in (("DDP", "o"), ("DataParallel", "s")):
        points = sorted((m.devices, m.samples_per_second) for m in measurements if m.mode == mode)
        if points:
            axes.plot(*zip(*points, strict=True), marker=marker, label=mode)
    axes.set_xticks(counts)
    axes.set_xlabel("GPUs" if gpus else "CPU ranks")
    axes.set_ylabel("samples / s")
    axes.set_ylim(bottom=0)
    axes.set_title("Scaling: DDP vs nn.DataParallel" if gpus else "Scaling: DDP on CPU ranks (DataParallel needs GPUs)")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.savefig(path, format="png")
