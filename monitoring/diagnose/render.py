"""Verdicts as text for people and JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from trainstack.ceilings import Ceiling
from trainstack.monitoring.diagnose.verdicts import Verdict


def _figure_line(figures: dict) -> str:
    parts = [f"{figures['ranks']} rank(s)"]
    if figures["steps_per_second"] is not None:
        parts.append(f"{figures['steps_per_second']:.2f} steps/s per rank")
    if figures["samples_per_second"] is not None:
        parts.append(f"{figures['samples_per_second']:.1f} samples/s in all")
    if figures["data_wait_ratio_max"] is not None and figures["data_wait_clock"] == "gpu":
        host = figures["host_data_wait_ratio_max"]
        parts.append(
            f"GPU starved for data at most {100 * figures['data_wait_ratio_max']:.0f}%"
            + ("" if host is None else f" (host in the loader at most {100 * host:.0f}%)")
        )
    elif figures["data_wait_ratio_max"] is not None:
        parts.append(f"data wait at most {100 * figures['data_wait_ratio_max']:.0f}%")
    if figures["straggler_wait_ratio_max"] is not None:
        parts.append(
            f"the ranks wait for the least-waiting one at most "
            f"{100 * figures['straggler_wait_ratio_max']:.0f}% of step time"
        )
    elif figures["ranks"] > 1:
        parts.append(
            "stragglers unknown (no rank's wait at the collectives is measured: the loop's monitor was "
            "given no DDP or FSDP model)"
        )
    elif figures["ranks"] == 1:
        parts.append("stragglers unknown (one rank: none waits for another)")
    if figures["comm_exposed_ratio_min"] is not None:
        parts.append(
            f"gradient all-reduce exposed at least {100 * figures['comm_exposed_ratio_min']:.0f}% "
            "of step time on every rank"
        )
    if figures["last_step_age_seconds"] is not None:
        parts.append(f"last step {figures['last_step_age_seconds']:.0f} s ago")
    if figures["mfu_mean"] is not None:
        parts.append(f"MFU {100 * figures['mfu_mean']:.0f}%")
    if figures["gpus"]:
        parts.append(f"{figures['gpus']} GPU(s)")
        if figures["gpu_utilization_mean"] is not None:
            parts.append(f"GPU utilization {100 * figures['gpu_utilization_mean']:.0f}% on average")
        if figures["gpu_memory_used_ratio_max"] is not None:
            parts.append(f"GPU memory at most {100 * figures['gpu_memory_used_ratio_max']:.0f}% used")
    return ", ".join(parts)


def render_text(
    source: str,
    verdicts: list[Verdict],
    figures: dict,
    notes: Sequence[str] = (),
    ceilings: dict[str, Ceiling] | None = None,
) -> str:
    """`ceilings`: verdict kind -> how much its fix can gain at most (trainstack/ceilings.py `of_ranks`)."""
    ceilings = ceilings or {}
    lines = [f"trainstack diagnose: {source}"]
    if not verdicts:
        lines.append(f"HEALTHY  {_figure_line(figures)}")
        return "\n".join([*lines, *notes])
    width = max(len(v.kind) for v in verdicts)
    for verdict in verdicts:
        lines.append(f"{verdict.kind.upper():<{width}}  {verdict.summary}")
        lines += [f"{'':<{width}}    evidence: {item}" for item in verdict.evidence]
        lines.append(f"{'':<{width}}    fix: {verdict.fix}")
        if verdict.kind in ceilings:
            lines.append(f"{'':<{width}}    ceiling: {ceilings[verdict.kind].text}")
    lines.append(f"figures: {_figure_line(figures)}")
    return "\n".join([*lines, *notes])


def render_json(
    source: str,
    verdicts: list[Verdict],
    figures: dict,
    notes: Sequence[str] = (),
    ceilings: dict[str, Ceiling] | None = None,
) -> str:
    """Each verdict with a time share carries its `ceiling` ({kind, share, speedup, text}; null for the others)."""
    return json.dumps(
        {
            "source": source,
            "healthy": not verdicts,
            "verdicts": verdict_dicts(verdicts, ceilings),
            "figures": figures,
            "notes": list(notes),
        },
        indent=2,
    )


def verdict_dicts(verdicts: list[Verdict], ceilings: dict[str, Ceiling] | None = None) -> list[dict]:
    """The verdicts as `--json` and summary.json carry them: kind, summary, evidence, fix, and `ceiling`."""
    ceilings = ceilings or {}
    return [{**asdict(v), "ceiling": ceilings[v.kind].to_dict() if v.kind in ceilings else None} for v in verdicts]
