"""The report as one self-contained HTML file: figures are embedded PNG data URIs, styles are inline, so the
file can be mailed, attached to a ticket or opened from a pod's volume with no server and no network."""

from __future__ import annotations

import base64
import html
import time

from trainstack import ceilings
from trainstack.monitoring.diagnose.finished import end_card, launcher_of
from trainstack.monitoring.diagnose.render import GOING, NOTHING_RECORDED_BY_TRAIN
from trainstack.monitoring.report.hangs import hang_section
from trainstack.monitoring.report.runfiles import RunFiles
from trainstack.monitoring.report.tables import cell, header_rows, rank_rows, segment_rows, summary_rows, time_rows
from trainstack.rundir import GPU_LOG_FILE, LAUNCHER_TRAIN, SUMMARY_FILE, TELEMETRY_DIR, UNSEEN_RANKS

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1040px; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f3f7; } td:first-child, th:first-child { text-align: left; }
figure { margin: 0 0 1.5em 0; } img { max-width: 100%; }
.note { color: #666; }
.card { background: #f6f8fa; border: 1px solid #ccc; padding: 0.6em; white-space: pre-wrap; }
"""


def _table(rows: list[dict[str, object]]) -> str:
    header = "".join(f"<th>{html.escape(str(key))}</th>" for key in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


GOING_LINE = (
    "a launcher holds the run directory: this report is of the steps recorded so far, and the run's own report "
    "follows when it ends"
)


def render(run: RunFiles, figures: dict[str, bytes], going: bool = False) -> str:
    title = f"trainstack run report: {run.summary.get('run_id') or run.run_dir.name}"
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>{html.escape(str(run.run_dir.resolve()))}, report written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}</p>",
    ]
    if run.summary or run.launches:
        # The same card `train` and `watch` print when the run ends (diagnose's render.card), first.
        ending = [f"{GOING}  {GOING_LINE}"] if going else None
        card = "\n".join(end_card(run.run_dir, {} if going else run.summary, ending))
        parts.append(f"<pre class='card'>{html.escape(card)}</pre>")
    if run.summary:
        parts.append(_table(header_rows(run)))
    parts.append("<h2>Summary</h2>")
    if run.summary:
        parts.append(_table(summary_rows(run)))
        if run.summary.get("verdicts") is not None:
            parts += [
                "<h2>Verdicts</h2>",
                "<p class='note'>What keeps the GPUs from being used, judged from the "
                "ranks' records when the run ended, as <code>trainstack diagnose</code> judges a live run "
                "(docs/diagnostics.md).</p>",
                _table(
                    [
                        {
                            "verdict": v["kind"],
                            "what": v["summary"],
                            "fix": v["fix"],
                            "at most": (v.get("ceiling") or {}).get("text", ""),
                        }
                        for v in run.summary["verdicts"]
                    ]
                )
                if run.summary["verdicts"]
                else "<p>Healthy: no verdict.</p>",
            ]
        if run.summary.get("segments"):
            parts += [
                "<h2>Segments</h2>",
                "<p class='note'>One per launch that trained the run; samples/s and "
                "tokens/s above are over all of them. <code>waited before</code>: from the previous segment's end "
                "to this one's start (a requeued job's time in the queue), which the time breakdown counts as "
                "<code>between_segments</code>.</p>",
                _table(segment_rows(run.summary["segments"])),
            ]
        if run.summary.get("evaluations"):
            parts += [
                "<h2>Evaluations</h2>",
                "<p class='note'>The mean loss over the evaluation data at each <code>--eval-every</code> step and "
                "at the end, every launch's.</p>",
                _table([{"step": e["step"], "eval loss": e["loss"]} for e in run.summary["evaluations"]]),
            ]
    else:
        parts.append(f"<p class='note'>No {SUMMARY_FILE}: the run is still going, or it stopped before writing it.</p>")
    parts.append("<h2>Per rank</h2>")
    per_rank = rank_rows(run)
    if per_rank:
        parts += [
            "<p class='note'>Over each rank's steady window, as diagnose judges it: its last launch's log "
            "intervals after the first, whose steps hold the warm-up. The figures plot every interval.</p>",
            _table(per_rank),
        ]
    elif run.ranks:  # a last launch that ended before its first interval: an earlier one's are in the figures
        parts.append("<p class='note'>No rank recorded an interval in the run's last launch.</p>")
    elif launcher_of(run.summary) == LAUNCHER_TRAIN:
        parts.append(
            f"<p class='note'>No rank records ({TELEMETRY_DIR}/rank-&lt;r&gt;.jsonl): {NOTHING_RECORDED_BY_TRAIN}.</p>"
        )
    else:
        parts.append(
            f"<p class='note'>No rank records ({TELEMETRY_DIR}/rank-&lt;r&gt;.jsonl): the command ran "
            f"and no rank recorded a step ({UNSEEN_RANKS}), so only the GPUs were seen; a few lines in the loop "
            "add steps, throughput, data wait and the per-rank verdicts.</p>"
        )
    if run.time_breakdown:
        times = run.time_breakdown
        longest = max(row["wall_seconds"] for row in times["ranks"])
        parts += [
            "<h2>Where the time went</h2>",
            f"<p>Each rank's wall time, from its first launch to its last exit (the run's: {cell(longest)} s, its "
            f"longest rank's; ranks run side by side, so their seconds are not added). Goodput "
            f"{cell(times['goodput'])}: compute over the ranks' wall time. A killed launch counts to its last "
            "record; <code>other</code> is what no part accounts for; <code>lost_progress</code> is the steps "
            "a later launch trained again; <code>between_segments</code> the time from one launch's end to the "
            "next one's start (waiting to be requeued, restarting); <code>not measured</code>: the rank could not "
            "measure that part (host-bound idle needs NVML on a GPU; communication, DDP or FSDP).</p>",
            _table(time_rows(run)),
        ]
        if found := ceilings.of_run(run.run_dir, times):
            parts += [
                "<h3>How much each fix can gain</h3>",
                "<p class='note'>A fix that removes a share s of the time makes it at most 1 / (1 - s) times "
                'faster (docs/diagnostics.md, "From verdict to fix").</p>',
                _table(
                    [
                        {"verdict": c.kind, "share": c.share, "speedup at most": c.speedup, "why": c.text}
                        for c in found.values()
                    ]
                ),
            ]
    parts += hang_section(run.run_dir)  # each stall's verdict, from RUN_DIR/hang/
    parts.append("<h2>Figures</h2>")
    for figure_id, image in figures.items():
        data = base64.b64encode(image).decode("ascii")
        parts.append(f"<figure id='{figure_id}'><img alt='{figure_id}' src='data:image/png;base64,{data}'></figure>")
    if not run.gpus:
        parts.append(
            f"<p class='note'>No GPU snapshots ({TELEMETRY_DIR}/{GPU_LOG_FILE}): the run had no GPU, or no "
            "exporter with NVML access; GPU utilization and memory figures are left out.</p>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)
