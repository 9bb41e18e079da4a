"""The report's "Hangs" section: each stall the launcher collected evidence for (RUN_DIR/hang/stall-<n>/,
docs/diagnostics.md "When a run hangs"), with its verdict, evidence and fix."""

from __future__ import annotations

import html
from pathlib import Path

from trainstack.hang_verdict import STALL_DIR, verdict_of
from trainstack.rundir import RunDir


def hang_section(run_dir: Path) -> list[str]:
    """HTML parts; none when the run never stalled."""
    hang_dir = RunDir(Path(run_dir)).hang
    stalls = sorted((int(m.group(1)), p) for p in hang_dir.glob("stall-*") if (m := STALL_DIR.match(p.name)))
    parts = []
    for _, stall in stalls:
        verdict = verdict_of(stall)
        evidence = "".join(f"<li>{html.escape(line)}</li>" for line in verdict.evidence)
        parts.append(f"<h3>{html.escape(stall.name)}</h3><p>{html.escape(verdict.headline)}</p><ul>{evidence}</ul>"
                     f"<p class='note'>fix: {html.escape(verdict.fix)}</p>")
    return ["<h2>Hangs</h2>", *parts] if parts else []
