"""The order `make test` hands the modules to its workers in (tests/helpers/module_order.py): the longest first, from
tests/module_seconds.json, which names every module that starts processes and no module that is gone."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.helpers.module_order import MODULE_SECONDS, SecondsRecorder, longest_first, read_seconds
from tests.helpers.runs import REPO


def test_the_longest_modules_come_first_and_each_keeps_its_tests_order():
    items = [
        SimpleNamespace(nodeid=nodeid)
        for nodeid in [
            "tests/unit/a/test_short.py::test_one",
            "tests/process/test_long.py::test_one",
            "tests/unit/a/test_unknown.py::test_one",
            "tests/process/test_long.py::test_two[x]",
            "tests/unit/a/test_short.py::test_two",
        ]
    ]
    seconds = {"tests/process/test_long.py": 90.0, "tests/unit/a/test_short.py": 0.4}
    assert [item.nodeid for item in longest_first(items, seconds)] == [
        "tests/process/test_long.py::test_one",
        "tests/process/test_long.py::test_two[x]",
        "tests/unit/a/test_short.py::test_one",
        "tests/unit/a/test_short.py::test_two",
        "tests/unit/a/test_unknown.py::test_one",
    ]


def test_the_recorder_adds_up_each_modules_phases_and_keeps_the_modules_it_did_not_run(tmp_path):
    path = tmp_path / "module_seconds.json"
    path.write_text(json.dumps({"tests/timing/test_other.py": 50.0, "tests/process/test_a.py": 99.0}))
    recorder = SecondsRecorder(path)
    for nodeid, duration in [
        ("tests/process/test_a.py::test_one", 10.0),  # its setup, call and teardown reports
        ("tests/process/test_a.py::test_one", 2.25),
        ("tests/process/test_a.py::test_two", 0.5),
        ("tests/unit/b/test_b.py::test_one", 0.01),
    ]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.pytest_sessionfinish()
    assert read_seconds(path) == {
        "tests/process/test_a.py": 12.8,
        "tests/timing/test_other.py": 50.0,
        "tests/unit/b/test_b.py": 0.0,
    }


def test_every_module_that_starts_processes_has_its_seconds_and_every_one_named_exists():
    recorded = read_seconds(MODULE_SECONDS)
    slow = {
        str(path.relative_to(REPO))
        for folder in ("process", "infra", "timing")
        for path in (REPO / "tests" / folder).glob("test_*.py")
    }
    assert not slow - set(recorded), "record their seconds: make test ARGS=--record-module-seconds"
    assert all((REPO / module).is_file() for module in recorded), "gone: make test ARGS=--record-module-seconds"
