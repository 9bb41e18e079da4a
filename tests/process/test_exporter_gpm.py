"""GPM in the exporter checked by promtool: the scrape is clean with and without GPM (the GPM series on a clock
the test moves: tests/unit/monitoring/test_exporter_gpm.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from tests.helpers.fakes import rig


@pytest.mark.slow
def test_promtool_check_metrics_is_clean_with_and_without_gpm():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install Debian's prometheus package (make system-deps)")
    for host in ("ddp_h100", "mixed"):
        exporter = rig(host)
        exporter.sample()
        exporter.sample()  # a pair: the GPM series too
        text = generate_latest(exporter.registry).decode()
        assert "trainstack_gpu_gpm_info" in text
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr
