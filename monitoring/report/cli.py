"""`trainstack report RUN_DIR`: write the run report into the run directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainstack.errors import EXIT_OK, ConfigError
from trainstack.rundir import RunDir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (the --output-dir of trainstack train)")


def run(args: argparse.Namespace) -> int:
    from trainstack.monitoring.report import render_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory; pass the --output-dir of a trainstack train run")
    print(render_report(run_dir, going=RunDir(run_dir).lease_is_fresh()))
    return EXIT_OK
