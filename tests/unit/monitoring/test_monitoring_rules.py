"""Prometheus config and rules: the committed rule files are what monitoring/prometheus/build_rules.py builds from
the threshold and ratio tables, promtool finds them clean, every alert has unit tests that see it fire and stay
quiet, and every alert links a runbook section that exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys

import pytest
import yaml

from tests.helpers.promql import undocumented
from tests.helpers.runs import REPO as ROOT
from trainstack import thresholds
from trainstack.monitoring.promql import metric_names

PROMETHEUS_DIR = ROOT / "monitoring/prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
UNIT_TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
RUNBOOKS = ROOT / "docs/alerts.md"
BUILD_RULES = PROMETHEUS_DIR / "build_rules.py"


def rules() -> list[dict]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def alert_rules() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


def load_build_rules():
    spec = importlib.util.spec_from_file_location("build_rules", BUILD_RULES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_committed_rule_files_and_alert_docs_are_current(capsys) -> None:
    assert load_build_rules().main(["--check"]) == 0, capsys.readouterr().err


def test_check_catches_a_threshold_edited_in_the_rule_file_instead_of_the_table(tmp_path, monkeypatch, capsys):
    build_rules = load_build_rules()
    rules_dir = tmp_path / "monitoring/prometheus/rules"
    shutil.copytree(PROMETHEUS_DIR / "rules", rules_dir)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    monkeypatch.setattr(build_rules, "ROOT", tmp_path)
    monkeypatch.setattr(build_rules, "RULES_DIR", rules_dir)
    monkeypatch.setattr(build_rules, "DOCS_FILE", tmp_path / "docs/alerts.md")
    assert build_rules.main(["--check"]) == 0
    alerts = rules_dir / "alerts.yml"
    planted = alerts.read_text().replace(f"ratio_rate2m > {thresholds.INPUT_BOUND.promql}\n", "ratio_rate2m > 0.3\n")
    assert planted != alerts.read_text(), "the input-bound alert no longer reads `ratio_rate2m > <threshold>`"
    alerts.write_text(planted)
    assert build_rules.main(["--check"]) == 1
    assert capsys.readouterr().err.strip() == (
        "monitoring/prometheus/rules/alerts.yml is stale: run python monitoring/prometheus/build_rules.py and "
        "commit the result"
    )
    assert build_rules.main([]) == 0
    assert build_rules.main(["--check"]) == 0


def test_each_threshold_names_an_alert_that_exists() -> None:
    """docs/alerts.md links each threshold to its alert: a renamed or removed alert must not leave a dead link."""
    names = {rule["alert"] for rule in alert_rules()}
    assert {t.alert for t in thresholds.THRESHOLDS if t.alert} <= names


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    outcomes: dict[str, set[bool]] = {}
    for path in UNIT_TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                outcomes.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    for rule in alert_rules():
        assert outcomes.get(rule["alert"]) == {True, False}, (
            f"{rule['alert']} needs an alert_rule_test where it fires and one where it does not"
        )


def test_every_alert_says_cause_and_fix_and_links_its_runbook() -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), flags=re.MULTILINE))
    names = {rule["alert"] for rule in alert_rules()}
    assert headings == names, "docs/alerts.md needs exactly one `## <alert>` section per alert"
    for rule in alert_rules():
        annotations = rule["annotations"]
        assert annotations["runbook_url"] == f"docs/alerts.md#{rule['alert'].lower()}"
        assert annotations["summary"] and "Fix:" in annotations["description"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule.get("record") or rule["alert"])
def test_rule_reads_recorded_or_documented_series(rule: dict) -> None:
    names = metric_names(rule["expr"])
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert {n for n in names if ":" in n} <= recorded, "reads a series no rule records"
    assert not undocumented(names), "reads metrics that docs/architecture.md and docs/metrics.md lack"


def documented_series(text: str) -> set[str]:
    """The recorded series the tables of docs/monitoring.md name, `{a,b}` spelt out."""
    found = set()
    for name in re.findall(r"`([a-z{][\w{},]*:[\w{},:]+)(?:\{[^`]*\})?`", text):
        names = [""]
        for part in re.split(r"(\{[^}]*\})", name):
            options = part[1:-1].split(",") if part.startswith("{") else [part]
            names = [prefix + option for prefix in names for option in options]
        found.update(names)
    return found


def test_every_recorded_series_is_in_the_monitoring_doc():
    doc = (ROOT / "docs/monitoring.md").read_text()
    recorded = {
        rule["record"]
        for group in yaml.safe_load((ROOT / "monitoring/prometheus/rules/recording.yml").read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    assert recorded - documented_series(doc) == set()
