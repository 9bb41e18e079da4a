"""A comparison for the terminal and as a self-contained HTML page in the run report's style."""

from __future__ import annotations

import html

from trainstack.monitoring.compare.comparison import Comparison
from trainstack.monitoring.report.page import STYLE
from trainstack.monitoring.report.page import _table as html_table  # the report's own table, so both pages match
from trainstack.monitoring.report.tables import cell


def _sections(comparison: Comparison) -> list[tuple[str, list[dict]]]:
    return [
        ("Throughput and goodput", comparison.headline()),
        ("Where the time went (each rank's mean)", comparison.parts()),
        ("Step time per rank", comparison.ranks()),
        ("Verdicts", comparison.verdicts()),
        ("Settings that differ", comparison.settings()),
    ]


def _text_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["  (none)"]
    cells = [[str(key) for key in rows[0]], *[[cell(value) for value in row.values()] for row in rows]]
    widths = [max(len(line[column]) for line in cells) for column in range(len(cells[0]))]
    return [
        "  " + "  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]


def text(comparison: Comparison, labels: tuple[str, str] | None = None) -> str:
    """labels: what to call A and B in place of their run directories (tune's trials, whose folders it removes)."""
    a, b = labels or (comparison.a.run_dir, comparison.b.run_dir)
    lines = [f"trainstack compare: A = {a}, B = {b}"]
    for title, rows in _sections(comparison):
        lines += ["", f"{title}:", *_text_table(rows)]
    return "\n".join(lines)


def page(comparison: Comparison, labels: tuple[str, str] | None = None) -> str:
    """Self-contained (its style inline, no link into either run directory): it outlives the runs it compares.
    labels: as for `text`."""
    short = labels or (comparison.a.run_dir.name, comparison.b.run_dir.name)
    title = f"trainstack compare: {short[0]} vs {short[1]}"
    a, b = labels or (str(comparison.a.run_dir.resolve()), str(comparison.b.run_dir.resolve()))
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>A = {html.escape(a)}, B = {html.escape(b)}</p>",
    ]
    for heading, rows in _sections(comparison):
        parts += [f"<h2>{html.escape(heading)}</h2>", html_table(rows) if rows else "<p class='note'>none</p>"]
    parts.append("</body></html>")
    return "\n".join(parts)
