"""Files generated from trainstack's tables (the rule files, the dashboards, the docs' tables, the Kubernetes
manifests): each generator says what its files should hold, and this writes them or, with --check, fails while a
committed one differs. The four generators (`make generate`) share this one command line and tail, so a stale file
reads the same from each of them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_or_check"]


def write_or_check(
    description: str,
    wanted: Callable[[], dict[Path, str]],
    root: Path,
    command: str,
    argv: list[str] | None = None,
    leftovers: Callable[[dict[Path, str]], list[Path]] | None = None,
) -> int:
    """The generator's main: `wanted()` maps each file to the text it should hold; `leftovers(wanted)` names files
    an earlier version generated that nothing builds now (a dashboard no longer built would still be provisioned).
    `command` is how a person reruns the generator. Returns the exit status."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed file differs from what this script builds",
    )
    args = parser.parse_args(argv)
    files = wanted()
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    left = leftovers(files) if leftovers else []
    if args.check:
        for path in stale:
            print(f"{path.relative_to(root)} is stale: run {command} and commit the result", file=sys.stderr)
        for path in left:
            print(f"{path.relative_to(root)} is no longer generated: delete it", file=sys.stderr)
        return 1 if stale or left else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path.relative_to(root)}")
    for path in left:
        path.unlink()
        print(f"deleted {path.relative_to(root)}")
    return 0
