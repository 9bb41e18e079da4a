"""Who reads each series, found in what reads it rather than kept beside each entry of the metric catalog: the
generated rule files (a recording rule, an alert), the Grafana dashboards (a panel's query, a variable's) and
diagnose's code (a verdict kind, its figures or its notes: monitoring/diagnose_readers.py). docs/metrics.md's
"read by" column is written from these (scripts/metrics-docs.py). A reader is written "record <series>",
"alert <name>", "panel <title>", "variable <name>" or "diagnose <kind>".

It reads the files of a checkout (the rule files and dashboards are not installed with the package): the docs
generator and the tests use it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trainstack import catalog
from trainstack.monitoring.diagnose_readers import diagnose_readers
from trainstack.monitoring.promql import PROMETHEUS_SERIES, label_values_metric, metric_names

MONITORING = Path(__file__).resolve().parent
RULE_FILES = sorted((MONITORING / "prometheus/rules").glob("*.yml"))
DASHBOARD_FILES = sorted((MONITORING / "grafana/dashboards").glob("*.json"))
READER_KINDS = ("record", "alert", "panel", "variable", "diagnose")


def rules() -> list[dict]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def dashboards() -> list[dict]:
    return [json.loads(path.read_text()) for path in DASHBOARD_FILES]


def queries() -> list[tuple[str, str]]:
    """(reader, PromQL) for every rule, dashboard panel query and dashboard variable."""
    found = [
        (f"record {rule['record']}" if "record" in rule else f"alert {rule['alert']}", rule["expr"]) for rule in rules()
    ]
    for dashboard in dashboards():
        for panel in dashboard["panels"]:
            found += [(f"panel {panel['title']}", target["expr"]) for target in panel.get("targets", [])]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                found.append((f"variable {variable['name']}", label_values_metric(variable["definition"])[0]))
    return found


def readers() -> dict[str, tuple[str, ...]]:
    """Catalog entry name (a metric's or a recorded series') -> the rules, panels, variables and diagnose kinds
    that read it, in the files' order. A series no catalog entry has is left out: tests/unit/trainstack/test_catalog.py fails on
    it."""
    found: dict[str, dict[str, None]] = {}
    for reader, expr in queries():
        for name in sorted(metric_names(expr) - PROMETHEUS_SERIES):
            if name in catalog.ENTRY_OF_SERIES:
                found.setdefault(catalog.ENTRY_OF_SERIES[name], {})[reader] = None
    for name, kinds in diagnose_readers().items():
        found.setdefault(name, {}).update(dict.fromkeys(f"diagnose {kind}" for kind in kinds))
    return {name: tuple(read_by) for name, read_by in found.items()}
