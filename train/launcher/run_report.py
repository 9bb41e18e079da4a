"""The report a launcher writes when its run ends (`trainstack train`, `trainstack watch`), while it still holds
the run directory's lease. The renderer is passed in: train/ does not import monitoring/."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from trainstack.errors import EXIT_OK, EXIT_RUNTIME, ConfigError
from trainstack.write_failure import WriteFailure

Judge = Callable[[Path], "list[dict] | None"]
"""A finished run's verdicts from its files (trainstack.monitoring.diagnose.records.judged), passed in as the
renderer is; None where no rank recorded anything to judge."""


def write_report(
    run_dir: Path, render: Callable[[Path], Path], program: str, kept: Callable[[], str] = lambda: ""
) -> int:
    """`render` (trainstack.monitoring.report.write_report) writes the report. Returns EXIT_RUNTIME when the storage
    refused it (one line said so, ending with `kept()`: what is safe regardless), else EXIT_OK."""
    try:
        print(f"{program}: report: {render(run_dir)}", file=sys.stderr)
    except ConfigError as problem:
        print(f"{program}: warning: no report: {problem}", file=sys.stderr)
    except WriteFailure as failure:
        # Not "rerun the same command": after a completed run it does nothing, the report command writes it.
        print(f"{program}: error: {failure}, then `trainstack report {run_dir}` writes it{kept()}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK
