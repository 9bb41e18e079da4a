"""The suite's layout. Each test lives in the folder of its tier, and its marks agree with the folder, since the
marks are what make selects by (`make check`: -m "not slow"; `make test`: -m timing after the rest):

- tests/unit/<package>/: starts no process (never marked slow), by the package it tests;
- tests/process/: starts ranks, exporters or commands (marked slow);
- tests/infra/: runs the infrastructure's tools: docker, promtool and Prometheus, kubectl, compose, hadolint
  (marked slow);
- tests/timing/: compares speeds measured in its own runs (marked timing, which nothing elsewhere is).

And no test module imports another: what two of them share lives in tests/helpers/, or in tests/conftest.py where
it is a fixture. A test module imported by another hands over its private helpers as an API nobody owns, and its
fixtures only through re-imports that hide from the linter (`noqa: F811`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import COLLECTED
from tests.helpers.runs import REPO

TEST_MODULE = re.compile(r"tests\.(\w+\.)*test_\w+(\..+)?")
WHERE = (
    "tests/unit/<package>/ if it starts no process, tests/process/ (ranks, exporters, commands) or tests/infra/ "
    "(docker, promtool, kubectl, compose) marked slow if it does, tests/timing/ marked timing if it compares speeds"
)


def imports(path: Path) -> list[list[str]]:
    """For each import statement in `path` (inside functions too; a relative one as if from tests/), the modules it
    names, and each name it imports as module.name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.append([alias.name for alias in node.names])
        elif isinstance(node, ast.ImportFrom):
            module = "tests." * (node.level > 0) + (node.module or "")
            found.append([module, *(f"{module.rstrip('.')}.{alias.name}" for alias in node.names)])
    return found


def cross_imports(tests: Path) -> list[str]:
    """'file: module' for each import of a tests/test_* module by any file under tests/ (test modules, helpers,
    fixtures, drivers), those inside functions and relative ones included."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for names in imports(path):
            hit = next((name for name in names if TEST_MODULE.fullmatch(name)), None)
            if hit:
                found.append(f"{path.relative_to(tests)}: {hit}")
    return found


def misplaced(tests: Iterable[tuple[str, set[str]]]) -> list[str]:
    """A line for each test (its node id under tests/, and its marks) whose folder and marks disagree, and one for
    each test module outside a tier's folder."""
    found = []
    for node_id, marks in tests:
        path = node_id.split("::")[0]
        folder, *rest = path.split("/")
        if not rest or folder not in {"unit", "process", "infra", "timing"}:
            line = f"tests/{path}: not in a tier's folder; put it in {WHERE}"
        elif folder == "unit" and len(rest) < 2:
            line = f"tests/{path}: a unit test module goes in the folder of the package it tests, tests/unit/<package>/"
        elif folder == "unit" and "slow" in marks:
            line = f"tests/{node_id}: marked slow under tests/unit/: it goes to tests/process/ or tests/infra/"
        elif folder in {"process", "infra"} and "slow" not in marks:
            line = f"tests/{node_id}: not marked slow under tests/{folder}/: mark it slow, or move it to tests/unit/"
        elif folder == "timing" and "timing" not in marks:
            line = f"tests/{node_id}: not marked timing under tests/timing/: mark it timing, or move it out"
        elif folder != "timing" and "timing" in marks:
            line = f"tests/{node_id}: marked timing outside tests/timing/: it goes there"
        else:
            continue
        if line not in found:
            found.append(line)
    return found


def test_the_folders_and_the_marks_agree(request: pytest.FixtureRequest):
    # What this session collected, before -m "not slow" deselected the very tests that could be misplaced: the whole
    # suite under `make check` and `make test`.
    collected = request.config.stash[COLLECTED]
    tests = [(item.nodeid.removeprefix("tests/"), {mark.name for mark in item.iter_markers()}) for item in collected]
    found = misplaced(tests)
    assert not found, "\n".join(found)


def test_a_misplaced_test_is_named_with_where_it_goes():
    assert misplaced(
        [
            ("test_new.py::test_a", set()),
            ("test_new.py::test_b", {"slow"}),
            ("drivers/test_x.py::test_c", set()),
            ("unit/test_flat.py::test_d", set()),
            ("unit/train/test_x.py::test_e", {"slow"}),
            ("process/test_x.py::test_f", {"parametrize"}),
            ("infra/test_x.py::test_g", set()),
            ("timing/test_x.py::test_h", {"slow"}),
            ("process/test_x.py::test_i", {"slow", "timing"}),
            ("unit/train/test_x.py::test_j", {"gpu"}),
            ("process/test_x.py::test_k", {"slow", "gpu"}),
            ("timing/test_x.py::test_l", {"slow", "timing"}),
        ]
    ) == [
        f"tests/test_new.py: not in a tier's folder; put it in {WHERE}",
        f"tests/drivers/test_x.py: not in a tier's folder; put it in {WHERE}",
        "tests/unit/test_flat.py: a unit test module goes in the folder of the package it tests, tests/unit/<package>/",
        "tests/unit/train/test_x.py::test_e: marked slow under tests/unit/: it goes to tests/process/ or tests/infra/",
        "tests/process/test_x.py::test_f: not marked slow under tests/process/: mark it slow, or move it to tests/unit/",
        "tests/infra/test_x.py::test_g: not marked slow under tests/infra/: mark it slow, or move it to tests/unit/",
        "tests/timing/test_x.py::test_h: not marked timing under tests/timing/: mark it timing, or move it out",
        "tests/process/test_x.py::test_i: marked timing outside tests/timing/: it goes there",
    ]


def test_no_test_module_imports_another():
    assert cross_imports(REPO / "tests") == []


def test_tests_import_the_app_and_monitoring_by_their_installed_names():
    # From the repository root `monitoring` and `train` import as folders too: a second copy of each module, with
    # its own state, beside the trainstack.monitoring and trainstack.train that the code under test uses.
    bare = {
        f"{path.relative_to(REPO)}: {name}"
        for path in (REPO / "tests").rglob("*.py")
        for names in imports(path)
        for name in names
        if name.split(".")[0] in {"monitoring", "train"}
    }
    assert bare == set()


def test_a_planted_cross_import_is_caught(tmp_path):
    (tmp_path / "test_a.py").write_text("def helper(): ...\n")
    (tmp_path / "test_b.py").write_text("def test_b():\n    from tests.test_a import helper\n")
    (tmp_path / "test_c.py").write_text("from tests import test_a\nfrom tests.helpers.runs import train\n")
    (tmp_path / "test_d.py").write_text("from .test_a import helper\nimport tests.test_a\n")
    (tmp_path / "test_e.py").write_text("from tests.process.test_a import helper\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "runs.py").write_text("from tests.test_a import helper\n")
    assert cross_imports(tmp_path) == [
        "helpers/runs.py: tests.test_a",
        "test_b.py: tests.test_a",
        "test_c.py: tests.test_a",
        "test_d.py: tests.test_a",
        "test_d.py: tests.test_a",
        "test_e.py: tests.process.test_a",
    ]
