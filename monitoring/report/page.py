"""The report as one self-contained HTML file: figures are embedded PNG data URIs, styles are inline, so the
file can be mailed, attached to a ticket or opened from a pod's volume with no server and no network."""

from __future__ import annotations

import base64
import html
import time

from trainstack.monitoring.report.hangs import hang_section
from trainstack.monitoring.report.runfiles import RunFiles
from trainstack.monitoring.report.tables import cell, rank_rows, segment_rows, time_rows
from trainstack.rundir import GPU_LOG_FILE, SUMMARY_FILE, TELEMETRY_DIR

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1040px; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f3f7; } td:first-child, th:first-child { text-align: left; }
figure { margin: 0 0 1.5em 0; } img { max-width: 100%; }
.note { color: #666; }
"""


def _table(rows: list[dict[str, object]]) -> str:
    header = "".join(f"<th>{html.escape(str(key))}</th>" for key in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row.values()) + "</tr>"
                   for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


def render(run: RunFiles, figures: dict[str, bytes]) -> str:
    title = f"trainstack run report: {run.summary.get('run_id') or run.run_dir.name}"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='note'>{html.escape(str(run.run_dir.resolve()))}, report written "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}</p>",
             "<h2>Summary</h2>"]
    if run.summary:
        parts.append(_table([{"field": key, "value": value} for key, value in run.summary.items()
                             if key not in ("segments", "time_breakdown")]))  # each has a table of its own
        if run.summary.get("segments"):
            parts += ["<h2>Segments</h2>", "<p class='note'>One per launch that trained the run; samples/s and "
                      "tokens/s above are over all of them.</p>", _table(segment_rows(run.summary["segments"]))]
    else:
        parts.append(f"<p class='note'>No {SUMMARY_FILE}: the run is still going, rank 0 stopped before writing "
                     "it, or it is a watched command's run, which writes none.</p>")
    parts.append("<h2>Per rank</h2>")
    if run.ranks:
        parts.append(_table(rank_rows(run)))
    else:
        parts.append(f"<p class='note'>No rank records ({TELEMETRY_DIR}/rank-&lt;r&gt;.jsonl): the command ran "
                     "without trainstack.monitor in its loop, so only the GPUs were seen; a few lines in the loop "
                     "add steps, throughput, data wait and the per-rank verdicts.</p>")
    if run.time_breakdown:
        times = run.time_breakdown
        parts += ["<h2>Where the time went</h2>",
                  f"<p>goodput {cell(times['goodput'])}: compute over the wall time of every rank, launch to exit, "
                  "over every launch. A killed launch counts to its last record; <code>other</code> is what no "
                  "part accounts for; <code>lost_progress</code> is the steps a later launch trained again.</p>",
                  _table(time_rows(times))]
    parts += hang_section(run.run_dir)  # each stall's verdict, from RUN_DIR/hang/
    parts.append("<h2>Figures</h2>")
    for figure_id, image in figures.items():
        data = base64.b64encode(image).decode("ascii")
        parts.append(f"<figure id='{figure_id}'><img alt='{figure_id}' src='data:image/png;base64,{data}'>"
                     "</figure>")
    if not run.gpus:
        parts.append(f"<p class='note'>No GPU snapshots ({TELEMETRY_DIR}/{GPU_LOG_FILE}): the run had no GPU, or no "
                     "exporter with NVML access; GPU utilization and memory figures are left out.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
