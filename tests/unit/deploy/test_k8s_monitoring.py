"""k8s/common/generated/ carries exactly monitoring/'s rules and dashboards, read statically (the script that
writes it run as a command: tests/infra/test_k8s_monitoring.py)."""

from __future__ import annotations

import json
from functools import partial

import yaml

from tests.helpers.runs import REPO as ROOT

GENERATED = ROOT / "k8s/common/generated"
RULES_DIR = ROOT / "monitoring/prometheus/rules"
DASHBOARDS_DIR = ROOT / "monitoring/grafana/dashboards"


def generated(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((GENERATED / name).read_text()) if d]


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
