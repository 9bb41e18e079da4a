"""`trainstack compare RUN_A RUN_B`: throughput and goodput as ratios, the time breakdown part by part (the part that
moved most marked), per-rank step times, each run's verdicts with their ceilings, and the settings that differ.
Prints to the terminal and writes an HTML page. Bad input (not a run directory, two different models): one line,
exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainstack.errors import EXIT_OK

PAGE = "compare.html"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the reference run directory")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="the run compared with it (ratios are B / A)")
    parser.add_argument("--html", type=Path, help=f"where the page goes (default RUN_B/{PAGE})")


def run(args: argparse.Namespace) -> int:
    from trainstack.monitoring.compare import profile, render
    from trainstack.monitoring.compare.comparison import Comparison
    from trainstack.write_failure import write_atomically

    comparison = Comparison(profile.load(args.run_a), profile.load(args.run_b))
    print(render.text(comparison))
    path = args.html or args.run_b / PAGE
    write_atomically(path, render.page(comparison), "the comparison page")
    print(f"page: {path}")
    return EXIT_OK
