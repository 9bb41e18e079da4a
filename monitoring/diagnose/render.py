"""Verdicts as text for people and JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from trainstack import breakdown
from trainstack.ceilings import Ceiling
from trainstack.monitoring.diagnose.verdicts import Verdict
from trainstack.rundir import UNSEEN_RANKS


def _throughput(figures: dict) -> list[str]:
    """The ranks and their throughput: what a healthy run's one line says."""
    parts = [f"{figures['ranks']} rank(s)"]
    if figures["steps_per_second"] is not None:
        parts.append(f"{figures['steps_per_second']:.2f} steps/s per rank")
    if figures["samples_per_second"] is not None:
        parts.append(f"{figures['samples_per_second']:.1f} samples/s in all")
    return parts


def _figure_line(figures: dict) -> str:
    parts = _throughput(figures)
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
    elif figures["ranks"] > 1 and not figures["steps_per_second"]:
        parts.append("stragglers unknown (no rank stepped in the window: nothing to compare)")
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


NOT_JUDGED = "NOT JUDGED"
# trainstack's own loop always records: under `train` the ranks ending first is the one reason.
NOTHING_RECORDED_BY_TRAIN = "no rank recorded a step: the ranks ended before their first record"
NOTHING_RECORDED = f"{NOTHING_RECORDED_BY_TRAIN}, or {UNSEEN_RANKS}"
HEALTHY = "HEALTHY"
FAILED, STOPPED, HUNG = "FAILED", "STOPPED", "HUNG"  # the card's first headline for a run that did not complete
GOING = "GOING"  # a report of a run whose launcher still holds its directory: of the steps recorded so far
CARD_EVIDENCE = 3  # the end-of-run card's evidence lines for its first verdict; diagnose and the report give all
CARD_RANKS = 8  # the card's per-rank time lines; the report has every rank
CARD_INDENT = "  "  # a card's details, under its headlines (which the terminal prefixes with the program)


def healthy_line(figures: dict, everything: bool = True) -> str:
    """A healthy run's one line: its ranks and throughput, with every other figure unless `everything` is off."""
    return f"{HEALTHY}  {_figure_line(figures) if everything else ', '.join(_throughput(figures))}"


def not_judged_line(reason: str) -> str:
    """The headline of a run of which nothing was judged: never HEALTHY, which would claim what no one saw."""
    return f"{NOT_JUDGED}  {reason}"


def unjudged_line(unjudged: Mapping[str, str]) -> str:
    """The ranks of a partly instrumented run that were not judged, and why."""
    return "not judged: " + "; ".join(f"rank {rank} ({why})" for rank, why in sorted(unjudged.items(), key=_rank_key))


def _rank_key(item: tuple[str, str]) -> tuple[int, str]:
    rank = item[0]
    return (int(rank), rank) if rank.isdigit() else (1 << 30, rank)


def verdict_lines(
    verdicts: Sequence[dict], evidence_limit: int | None = None, first_only: bool = False, indent: str | None = None
) -> list[str]:
    """Verdicts as `verdict_dicts` gives them, as people read them: each one's kind and summary, then its evidence,
    its fix in the launcher's words and its ceiling. The one wording of diagnose, the end-of-run card and the report.
    `evidence_limit` cuts the evidence (saying how many more); `first_only` gives the others their headline only;
    `indent` the details' (default: under the summary, past the widest kind)."""
    if not verdicts:
        return []
    width = max(len(v["kind"]) for v in verdicts)
    under = f"{'':<{width}}    " if indent is None else indent
    lines = []
    for number, verdict in enumerate(verdicts):
        lines.append(f"{verdict['kind'].upper():<{width}}  {verdict['summary']}")
        if first_only and number > 0:
            continue
        evidence = list(verdict["evidence"])
        shown = evidence if evidence_limit is None else evidence[:evidence_limit]
        lines += [f"{under}evidence: {item}" for item in shown]
        if len(shown) < len(evidence):
            lines.append(f"{under}evidence: {len(evidence) - len(shown)} more in the report")
        lines.append(f"{under}fix: {verdict['fix']}")
        if verdict.get("ceiling"):
            lines.append(f"{under}ceiling: {verdict['ceiling']['text']}")
    return lines


def render_text(
    source: str,
    verdicts: list[Verdict],
    figures: dict,
    notes: Sequence[str] = (),
    ceilings: dict[str, Ceiling] | None = None,
    not_judged: str | None = None,
    unjudged: Mapping[str, str] | None = None,
) -> str:
    """`ceilings`: verdict kind -> how much its fix can gain at most (trainstack/ceilings.py `of_ranks`).
    `not_judged`: why no rank could be judged (verdicts.not_judged): the headline then says so, never HEALTHY;
    `unjudged`: rank -> why, for the ranks of a partly instrumented run that were not judged."""
    lines = [f"trainstack diagnose: {source}"]
    if not verdicts and not_judged:
        lines.append(not_judged_line(not_judged))
        if figures["gpus"]:  # what the GPUs alone showed; without them "0 rank(s)" says nothing
            lines.append(f"figures: {_figure_line(figures)}")
    elif not verdicts:
        lines.append(healthy_line(figures))
    else:
        lines += verdict_lines(verdict_dicts(verdicts, ceilings))
        if not_judged:
            lines.append(f"no rank judged: {not_judged}")
        lines.append(f"figures: {_figure_line(figures)}")
    if unjudged:
        lines.append(unjudged_line(unjudged))
    return "\n".join([*lines, *notes])


def render_json(
    source: str,
    verdicts: list[Verdict],
    figures: dict,
    notes: Sequence[str] = (),
    ceilings: dict[str, Ceiling] | None = None,
    not_judged: str | None = None,
    unjudged: Mapping[str, str] | None = None,
) -> str:
    """Each verdict with a time share carries its `ceiling` ({kind, share, speedup, text}; null for the others).
    `judged` is false, with `not_judged` saying why, where no rank could be judged: `healthy` is then false too;
    `ranks_not_judged`: rank -> why, for those of a partly instrumented run."""
    return json.dumps(
        {
            "source": source,
            "healthy": not verdicts and not not_judged,
            "judged": not not_judged,
            "not_judged": not_judged,
            "ranks_not_judged": dict(unjudged or {}),
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


# The card's time line: the parts a user acts on, the loop's pauses (evaluation, checkpoints) folded into one figure
# (the report splits them) and compiling apart from them, since no pause of the loop's makes it.
_CARD_PARTS = (
    ("compute", (breakdown.COMPUTE,)),
    ("comm exposed", (breakdown.COMM_EXPOSED,)),
    ("data starvation", (breakdown.DATA_STARVATION,)),
    ("host bound", (breakdown.HOST_BOUND,)),
    ("pauses", tuple(part for part in breakdown.PAUSES if part != breakdown.COMPILE)),
    ("compile", (breakdown.COMPILE,)),
    ("startup", (breakdown.STARTUP,)),
    ("lost", (breakdown.LOST_PROGRESS,)),
    ("between segments", (breakdown.BETWEEN_SEGMENTS,)),
    ("other", (breakdown.OTHER,)),
)


def duration(seconds: float) -> str:
    """Seconds as people read a duration: 42.1 s, 3m 05s, 2h 04m."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def time_lines(times: dict | None, limit: int = CARD_RANKS, ended_early: bool = False) -> list[str]:
    """Each rank's wall time (summary.json's `time_breakdown`) as one line of its parts' shares, the ones that took
    any, indented as the card's details; the first `limit` ranks, then how many more. `ended_early`: the run hung,
    failed or was stopped, and a rank's time ends at its last record (a stall after it is not in it)."""
    if not times:
        return []
    lines = []
    for row in times["ranks"][:limit]:
        wall = row["wall_seconds"]
        shares = [
            (name, sum(row["seconds"].get(part, 0.0) for part in parts) / wall if wall > 0 else 0.0)
            for name, parts in _CARD_PARTS
        ]
        shown = ", ".join(f"{name} {100 * share:.0f}%" for name, share in shares if share >= 0.005)
        until = " to its last record" if ended_early else ""
        lines.append(f"{CARD_INDENT}time: rank {row['rank']}, {duration(wall)}{until}: {shown}")
    if len(times["ranks"]) > limit:
        lines.append(f"{CARD_INDENT}time: {len(times['ranks']) - limit} more rank(s) in the report")
    return lines


def _who_ended(summary: Mapping) -> str:
    """Which ranks ended on their own (their records closed) and which were killed, where a failed command's ranks
    did both: a launcher ends the others once one fails, so the failing rank is among the former."""
    ended: dict[str, list[str]] = {"exited": [], "killed": []}
    for row in (summary.get("time_breakdown") or {}).get("ranks", []):
        if row.get("segments"):
            ended.setdefault(row["segments"][-1].get("ended", ""), []).append(str(row["rank"]))
    if not (ended["exited"] and ended["killed"]):
        return ""
    return (
        f" (rank {', '.join(ended['exited'])} ended on its own, rank {', '.join(ended['killed'])} was killed, as a "
        "launcher ends the others once one fails)"
    )


def ending_lines(summary: Mapping) -> list[str]:
    """How a run that did not complete ended, from its summary.json, as the card's first headline: the stall it hung
    in (`hang`: its verdict, fix and evidence), its failure, or the signal that stopped it. None for a completed
    run, or a summary that does not say (a launch whose rank 0 wrote none)."""
    reason, code = summary.get("exit_reason"), summary.get("exit_code")
    what = "the command" if summary.get("command") else "the run"  # watch's summary names its command
    if (hang := summary.get("hang")) and reason != "completed":
        return [
            f"{HUNG}  {hang['headline']}",
            *([f"{CARD_INDENT}fix: {hang['fix']}"] if hang.get("fix") else []),
            *([f"{CARD_INDENT}evidence: {hang['evidence_dir']}"] if hang.get("evidence_dir") else []),
        ]
    if reason == "failed":
        error = str(summary.get("error") or "").strip().splitlines()
        return [f"{FAILED}  {error[0] if error else f'{what} exited with code {code}{_who_ended(summary)}'}"]
    if reason == "preempted":
        return [f"{STOPPED}  {what} was stopped by a signal before its last step (exit code {code})"]
    return []


def card(
    verdicts: list[dict] | None,
    figures: dict | None,
    times: dict | None,
    not_judged: str | None = None,
    unjudged: Mapping[str, str] | None = None,
    ending: Sequence[str] = (),
) -> list[str]:
    """The end-of-run card `train` and `watch` print and the report leads with: the headline verdict with its
    evidence, fix and ceiling (the others by their headline), each rank's time, in diagnose's words. A healthy run
    is one line with its throughput; a run of which nothing was judged, one line saying why. `verdicts` None: the
    run was not judged (`not_judged` says why). `ending` (`ending_lines`): how a run that did not complete ended,
    first; its steps until then are judged after it, and none is called healthy."""
    lines = list(ending)
    if not verdicts:
        if verdicts is None or not_judged:
            lines.append(not_judged_line(not_judged or NOTHING_RECORDED))
        elif ending:
            shown = f", {', '.join(_throughput(figures))}" if figures else ""
            lines.append(f"{CARD_INDENT}until then: no problem found{shown}")
        else:
            lines.append(healthy_line(figures, everything=False) if figures else HEALTHY)
        return lines + ([CARD_INDENT + unjudged_line(unjudged)] if unjudged else [])
    lines += verdict_lines(verdicts, evidence_limit=CARD_EVIDENCE, first_only=True, indent=CARD_INDENT)
    if unjudged:
        lines.append(CARD_INDENT + unjudged_line(unjudged))
    return lines + time_lines(times, ended_early=bool(ending))
