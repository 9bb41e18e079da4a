"""k8s/common/generated/ carries exactly monitoring/'s rules and dashboards (scripts/k8s-monitoring.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import REPO as ROOT

SCRIPT = ROOT / "scripts/k8s-monitoring.py"
GENERATED = ROOT / "k8s/common/generated"
RULES_DIR = ROOT / "monitoring/prometheus/rules"
DASHBOARDS_DIR = ROOT / "monitoring/grafana/dashboards"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)


def generated(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((GENERATED / name).read_text()) if d]


@pytest.mark.slow
def test_committed_output_is_current():
    result = run_script(SCRIPT, "--check")
    assert result.returncode == 0, result.stderr


def test_prometheus_rules_carry_every_rule_file_unchanged():
    rules = generated("prometheusrules.yaml")
    sources = sorted(RULES_DIR.glob("*.yml"))
    assert sources, f"no rule files in {RULES_DIR}"
    assert all(rule["kind"] == "PrometheusRule" for rule in rules)
    as_text = partial(json.dumps, sort_keys=True)
    assert sorted(as_text(rule["spec"]["groups"]) for rule in rules) == sorted(
        as_text(yaml.safe_load(source.read_text())["groups"]) for source in sources
    )


def test_dashboards_are_configmaps_for_the_grafana_sidecar_with_the_json_unchanged():
    configmaps = generated("dashboards.yaml")
    sources = sorted(DASHBOARDS_DIR.glob("*.json"))
    assert len(configmaps) == len(sources)
    by_file = {key: (cm, text) for cm in configmaps for key, text in cm["data"].items()}
    for source in sources:
        configmap, text = by_file[source.name]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert text == source.read_text()


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
