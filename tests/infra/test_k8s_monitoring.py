"""k8s/common/generated/ carries exactly monitoring/'s rules and dashboards (scripts/k8s-monitoring.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import REPO as ROOT

SCRIPT = ROOT / "scripts/k8s-monitoring.py"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_committed_output_is_current():
    result = run_script(SCRIPT, "--check")
    assert result.returncode == 0, result.stderr


def _scratch_checkout(tmp_path: Path) -> Path:
    """The script resolves every path from its own location: a copy in a scratch tree works on that tree."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    rules = tmp_path / "monitoring/prometheus/rules"
    rules.mkdir(parents=True)
    (rules / "alerts.yml").write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: |\n          up == 0\n        for: 1m\n"
    )
    dashboards = tmp_path / "monitoring/grafana/dashboards"
    dashboards.mkdir(parents=True)
    (dashboards / "Training Overview.json").write_text('{"title": "Training"}\n')
    return tmp_path / "scripts" / SCRIPT.name


@pytest.mark.slow
def test_check_fails_once_a_source_changes(tmp_path):
    script = _scratch_checkout(tmp_path)
    assert run_script(script, "--check").returncode == 1  # nothing generated yet
    assert run_script(script).returncode == 0
    assert run_script(script, "--check").returncode == 0
    rule = yaml.safe_load((tmp_path / "k8s/common/generated/prometheusrules.yaml").read_text())
    assert rule["metadata"]["name"] == "trainstack-alerts"
    assert rule["spec"]["groups"][0]["rules"][0]["expr"] == "up == 0\n"
    dashboard = yaml.safe_load((tmp_path / "k8s/common/generated/dashboards.yaml").read_text())
    assert dashboard["metadata"]["name"] == "trainstack-training-overview-dashboard"

    (tmp_path / "monitoring/prometheus/rules/alerts.yml").write_text("groups: []\n")
    result = run_script(script, "--check")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "k8s/common/generated/prometheusrules.yaml is stale: run python scripts/k8s-monitoring.py and commit the result"
    )


@pytest.mark.slow
def test_a_file_that_is_not_a_rule_file_is_refused_in_one_line(tmp_path):
    script = _scratch_checkout(tmp_path)
    (tmp_path / "monitoring/prometheus/rules/tests.yml").write_text("rule_files: [alerts.yml]\ntests: []\n")
    result = run_script(script)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "monitoring/prometheus/rules/tests.yml is not a Prometheus rule file (no top-level `groups:` list)"
    )
