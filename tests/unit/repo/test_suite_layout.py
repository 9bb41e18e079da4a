"""No test module imports another: what two of them share lives in tests/helpers/, or in tests/conftest.py where
it is a fixture. A test module imported by another hands over its private helpers as an API nobody owns, and its
fixtures only through re-imports that hide from the linter (`noqa: F811`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.runs import REPO

TEST_MODULE = re.compile(r"tests\.test_\w+(\..+)?")


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
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "runs.py").write_text("from tests.test_a import helper\n")
    assert cross_imports(tmp_path) == [
        "helpers/runs.py: tests.test_a",
        "test_b.py: tests.test_a",
        "test_c.py: tests.test_a",
        "test_d.py: tests.test_a",
        "test_d.py: tests.test_a",
    ]
