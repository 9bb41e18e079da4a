"""The code style the project holds itself to (pyproject.toml's ruff and mypy settings), checked with the tests."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

pytestmark = pytest.mark.slow

TYPECHECK = REPO / "scripts/typecheck.py"
PACKAGES = ("trainstack", "train", "monitoring", "supervisor", "commands")


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed: make setup installs it from requirements-dev.lock")
    result = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
    formatted = subprocess.run([ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert formatted.returncode == 0, f"run `ruff format .`:\n{formatted.stdout[-4000:]}"


def _typecheck():
    """scripts/typecheck.py as a module: the list of modules it gives mypy."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy not installed: make setup installs it from requirements-dev.lock")
    spec = importlib.util.spec_from_file_location("typecheck", TYPECHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mypy_is_clean():
    """The type checker over trainstack/, train/ and monitoring/ (scripts/typecheck.py, pyproject.toml's
    [tool.mypy]), each module under the name it is imported by."""
    _typecheck()
    result = subprocess.run([sys.executable, str(TYPECHECK)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_mypy_sees_every_file():
    """Every Python file of the three packages is checked, under its installed name where it is installed: a
    module mypy named by its folder (train.rank.trainer) would read every import from trainstack.* as Any."""
    modules = {module.path: module.module for module in _typecheck().installed_modules(REPO)}
    files = {str(path.relative_to(REPO)) for folder in PACKAGES for path in (REPO / folder).rglob("*.py")}
    assert files <= set(modules), sorted(files - set(modules))
    assert modules["train/rank/trainer.py"] == "trainstack.train.rank.trainer"
    assert modules["monitoring/diagnose/__init__.py"] == "trainstack.monitoring.diagnose"
    assert modules["commands/cli.py"] == "trainstack.commands.cli"
    assert modules["supervisor/supervised.py"] == "trainstack.supervisor.supervised"
