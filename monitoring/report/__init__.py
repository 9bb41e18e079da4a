"""The run report: `render_report(run_dir)` turns a run directory's telemetry into its report.html.

The launcher calls it at the end of every run; `trainstack report RUN_DIR` calls it by hand.
"""

from __future__ import annotations

from pathlib import Path

from trainstack.rundir import RunDir
from trainstack.write_failure import write_atomically


def render_report(run_dir: Path | str, going: bool = False) -> Path:
    """Write the run's report and return its path. Raises trainstack.errors.ConfigError when RUN_DIR holds no
    telemetry records, trainstack.write_failure.WriteFailure when the storage refuses the page. `going`: another
    launcher holds the run directory now (`trainstack report` of a live run): the page is of the steps recorded so
    far, never headed as a finished run. matplotlib is imported here, not at import time, so the CLI stays quick."""
    import matplotlib

    matplotlib.use("Agg")
    from trainstack.monitoring.report import figures, page
    from trainstack.monitoring.report.runfiles import load_run

    run = load_run(Path(run_dir))
    images = {}
    for spec in figures.FIGURES:
        figure = spec.draw(run)
        if figure is not None:
            images[spec.id] = figures.png(figure)
    path = RunDir(run.run_dir).report
    write_atomically(path, page.render(run, images, going), "the report")
    return path
