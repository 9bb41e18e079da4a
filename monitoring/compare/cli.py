"""`trainstack compare RUN_A RUN_B`: throughput and goodput as ratios, the time breakdown part by part (the part that
moved most marked), per-rank step times, each run's verdicts with their ceilings, and the settings that differ.
Prints to the terminal and writes an HTML page. Bad input (not a run directory, two different models): one line,
exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainstack.errors import EXIT_OK, ConfigError
from trainstack.rundir import RunDir, check_file_path

PAGE = "compare.html"
PAGE_MARK = "<title>trainstack compare: "  # how a page compare wrote begins (render.page)
PAGE_MARK_WITHIN = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the reference run directory")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="the run compared with it (ratios are B / A)")
    parser.add_argument("--html", type=Path, help=f"where the page goes (default RUN_B/{PAGE})")


def check_page_path(path: Path) -> None:
    """ConfigError unless the page can go to `path`: a new file, or a page of compare's own, which a second compare
    writes anew; never a user's file, a checkpoint's or a run's own."""
    check_file_path(path, "--html")
    if path.exists():
        with path.open("rb") as existing:
            head = existing.read(PAGE_MARK_WITHIN)
        if PAGE_MARK.encode() not in head:
            raise ConfigError(f"--html {path} exists and is not a page compare wrote; pass --html NEW_PATH")


def run(args: argparse.Namespace) -> int:
    from trainstack.monitoring.compare import profile, render
    from trainstack.monitoring.compare.comparison import Comparison
    from trainstack.write_failure import write_atomically

    comparison = Comparison(profile.load(args.run_a), profile.load(args.run_b))
    path = args.html or args.run_b / PAGE
    check_page_path(path)
    for name, run_dir in (("A", args.run_a), ("B", args.run_b)):
        if RunDir(run_dir).lease_is_fresh():  # a launcher holds it now
            print(
                f"trainstack compare: note: {name} ({run_dir}) is still going: compared on its steps so far",
                file=sys.stderr,
            )
    print(render.text(comparison))
    write_atomically(path, render.page(comparison), "the comparison page")
    print(f"page: {path}")
    return EXIT_OK
