"""The order the suite's modules go to pytest-xdist's workers in: the longest first.

`make test` runs the tests that start processes on several workers, a module to a worker (`--dist loadscope`).
xdist hands the modules out by their number of tests, the most first, unless told to keep the order they were
collected in (`--no-loadscope-reorder`, which `make test` passes). By their number of tests, unit modules of many
cases went first, and the Docker module (2 tests, 4 minutes) and the long tests/process/test_train_* and
test_run_lifetimes modules came last and ran on alone while the other workers had nothing left: the last 2-3
minutes of a run had the 2-core machine's cores a third busy (docs/benchmarks.md, "Test suite time"). Longest first,
the short modules (tests/unit/'s among them) fill the end in.

The seconds are each module's setup, call and teardown times in one run of the suite, kept in
tests/module_seconds.json; `pytest --record-module-seconds` writes those of the modules it ran anew. They only rank
the modules: a module not in the file counts as the shortest.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

MODULE_SECONDS = Path(__file__).parents[1] / "module_seconds.json"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def read_seconds(path: Path = MODULE_SECONDS) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def longest_first(items: Iterable[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` with the modules that took longest first; each module's tests keep their order."""
    return sorted(items, key=lambda item: -seconds.get(module_of(item.nodeid), 0.0))


class SecondsRecorder:
    """Adds up each module's times from the test reports (under xdist, the controller gets every worker's), and
    writes them into `path` when the session ends, beside the modules this session did not run."""

    def __init__(self, path: Path = MODULE_SECONDS):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        merged = {**read_seconds(self.path), **{module: round(s, 1) for module, s in self.seconds.items()}}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
