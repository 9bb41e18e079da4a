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


def text(comparison: Comparison) -> str:
    lines = [f"trainstack compare: A = {comparison.a.run_dir}, B = {comparison.b.run_dir}"]
    for title, rows in _sections(comparison):
        lines += ["", f"{title}:", *_text_table(rows)]
    return "\n".join(lines)


def page(comparison: Comparison) -> str:
    title = f"trainstack compare: {comparison.a.run_dir.name} vs {comparison.b.run_dir.name}"
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>A = {html.escape(str(comparison.a.run_dir.resolve()))}, "
        f"B = {html.escape(str(comparison.b.run_dir.resolve()))}</p>",
    ]
    for heading, rows in _sections(comparison):
        parts += [f"<h2>{html.escape(heading)}</h2>", html_table(rows) if rows else "<p class='note'>none</p>"]
    parts.append("</body></html>")
    return "\n".join(parts)
