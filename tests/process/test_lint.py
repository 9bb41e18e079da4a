"""The code style the project holds itself to (pyproject.toml's ruff settings), checked with the tests."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

pytestmark = pytest.mark.slow


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed: make setup installs it from requirements-dev.lock")
    result = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
    formatted = subprocess.run([ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert formatted.returncode == 0, f"run `ruff format .`:\n{formatted.stdout[-4000:]}"


def test_mypy_is_clean():
    """The type checker over trainstack/ (pyproject.toml's [tool.mypy]): the shared ground and the public API."""
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy not installed: make setup installs it from requirements-dev.lock")
    result = subprocess.run([mypy], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
