"""The report's "Hangs" section: each stall the launcher collected evidence for (RUN_DIR/hang/stall-<n>/,
docs/diagnostics.md "When a run hangs"), with its verdict, evidence and fix."""

from __future__ import annotations

import html
from pathlib import Path

from trainstack.hang_verdict import verdict_of
from trainstack.rundir import RunDir


def hang_section(run_dir: Path) -> list[str]:
    """HTML parts; none when the run never stalled."""
    parts = []
    for stall in RunDir(Path(run_dir)).stalls():
        verdict = verdict_of(stall.path)
        evidence = "".join(f"<li>{html.escape(line)}</li>" for line in verdict.evidence)
        parts.append(
            f"<h3>{html.escape(stall.path.name)}</h3><p>{html.escape(verdict.headline)}</p><ul>{evidence}</ul>"
            f"<p class='note'>fix: {html.escape(verdict.fix)}</p>"
        )
    return ["<h2>Hangs</h2>", *parts] if parts else []
