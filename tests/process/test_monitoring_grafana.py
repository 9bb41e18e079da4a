"""Grafana's build script run as a command: the committed dashboards and the panel docs are what
monitoring/grafana/build_dashboards.py builds (the dashboards read statically: tests/unit/monitoring/)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.runs import REPO

GRAFANA_DIR = REPO / "monitoring/grafana"
DASHBOARD_FILES = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))


@pytest.mark.slow
def test_committed_dashboards_and_panel_docs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(GRAFANA_DIR / "build_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert DASHBOARD_FILES, "no dashboards built"
