"""The metric catalog (trainstack/catalog.py) against everything that reads a metric: every metric a recording
rule, alert, rule unit test, dashboard query or variable, or `trainstack diagnose` names is in the catalog, each
entry's `readers` are exactly what reads it, and the names follow the project's conventions (the producers, on a
live scrape of an exporter process: tests/process/test_catalog.py)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.catalog import RECORDED, SAMPLES, unknown
from tests.helpers.promql import PROMETHEUS_SERIES, label_values_metric, metric_names
from tests.helpers.runs import REPO
from trainstack import catalog, ratios

RULE_FILES = sorted((REPO / "monitoring/prometheus/rules").glob("*.yml"))
RULE_TEST_FILES = sorted((REPO / "monitoring/prometheus/tests").glob("*.yml"))
DASHBOARD_FILES = sorted((REPO / "monitoring/grafana/dashboards").glob("*.json"))
DIAGNOSE_DIR = REPO / "monitoring/diagnose"
# Where a metric name may not be written outside the catalog (issue 11: one module names the metrics).
PYTHON_DIRS = ("train", "monitoring", "bench", "trainstack")
CATALOG_FILE = REPO / "trainstack/catalog.py"
METRIC_NAME = re.compile(r"(?<![\w:])trainstack_(?:train|gpu|exporter|watch)_[a-z0-9_]*")


def entry(name: str) -> catalog.Metric | catalog.Recorded:
    return SAMPLES.get(name) or RECORDED[name]


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


def test_names_follow_the_project_conventions():
    names = [metric.name for metric in catalog.METRICS] + list(RECORDED)
    assert len(names) == len(set(names)), "a name is in the catalog twice"
    for metric in catalog.METRICS:
        assert metric.name.startswith(catalog.PREFIXES[metric.source]), metric.name
        assert metric.name.endswith("_total") == (metric.type == catalog.COUNTER), metric.name
        assert metric.name.endswith("_info") == (metric.type == catalog.INFO or metric.values == "1"), metric.name
        assert bool(metric.buckets) == (metric.type == catalog.HISTOGRAM), metric.name
        assert metric.help.endswith(".") and metric.origin, metric.name
        assert all(
            reader.split(" ", 1)[0] in {"record", "alert", "panel", "variable", "diagnose"} for reader in metric.readers
        ), metric.name
    for series in catalog.RECORDED:
        level, base, operation = series.name.split(":")
        assert level in {"rank", "job", "gpu"} and base.startswith(catalog.PREFIX) and operation, series.name


@pytest.mark.parametrize(("reader", "expr"), queries(), ids=[reader for reader, _ in queries()])
def test_rules_and_dashboards_read_only_catalog_metrics(reader: str, expr: str):
    assert not unknown(metric_names(expr)), f"{reader} reads series trainstack/catalog.py lacks"


def test_the_recording_rules_record_the_catalogs_recorded_series():
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert recorded == set(RECORDED), (
        f"recorded by the rules, not in the catalog: {sorted(recorded - set(RECORDED))}; "
        f"in the catalog, recorded by no rule: {sorted(set(RECORDED) - recorded)}"
    )


def test_rule_unit_tests_feed_only_catalog_metrics():
    for path in RULE_TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            names = {series["series"].split("{")[0] for series in case.get("input_series", [])}
            for check in case.get("promql_expr_test", []):
                names |= metric_names(check["expr"])
            assert not unknown(names), f"{path.name}: feeds or asks for series trainstack/catalog.py lacks"


def test_readers_are_what_the_rules_and_dashboards_read():
    actual: dict[str, set[str]] = {}
    for reader, expr in queries():
        for name in metric_names(expr) - PROMETHEUS_SERIES:
            actual.setdefault(entry(name).name, set()).add(reader)
    declared_kinds = ("record ", "alert ", "panel ", "variable ")
    wrong = []
    for item in [*catalog.METRICS, *catalog.RECORDED]:
        declared = {reader for reader in item.readers if reader.startswith(declared_kinds)}
        read_by = actual.get(item.name, set())
        if declared != read_by:
            wrong.append(f"{item.name}: add {sorted(read_by - declared)}, remove {sorted(declared - read_by)}")
    assert not wrong, "trainstack/catalog.py's readers differ from the rules and dashboards:\n" + "\n".join(wrong)


def catalog_references(path: Path) -> set[str]:
    """The catalog entries a module uses (`catalog.TRAIN_STEPS`...)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "catalog"
        and isinstance(getattr(catalog, node.attr, None), catalog.Metric)
    }


def ratio_references(path: Path) -> set[str]:
    """The metrics a module reads through trainstack/ratios.py's definitions (`ratios.DATA_WAIT_SHARE`...)."""
    used = [
        getattr(ratios, node.attr, None)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ratios"
    ]
    samples = {sample: metric.name for metric in catalog.METRICS for sample in metric.sample_names}
    return {
        samples[series]
        for definition in used
        if isinstance(definition, (ratios.Ratio, ratios.Throttle))
        for series in definition.series
    }


def verdict_kinds() -> set[str]:
    tree = ast.parse((DIAGNOSE_DIR / "verdicts.py").read_text())
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict"
    }


def test_diagnose_reads_what_the_catalog_says():
    read = {getattr(catalog, name).name for path in DIAGNOSE_DIR.glob("*.py") for name in catalog_references(path)}
    read |= {name for path in DIAGNOSE_DIR.glob("*.py") for name in ratio_references(path)}
    declared = {
        metric.name for metric in catalog.METRICS if any(reader.startswith("diagnose ") for reader in metric.readers)
    }
    assert read == declared, (
        f"read by monitoring/diagnose, no diagnose reader in the catalog: "
        f"{sorted(read - declared)}; declared but not read: {sorted(declared - read)}"
    )
    kinds = verdict_kinds() | {"figures"}
    assert len(kinds) > 5
    for metric in catalog.METRICS:
        named = {reader.split(" ", 1)[1] for reader in metric.readers if reader.startswith("diagnose ")}
        assert named <= kinds, f"{metric.name}: no verdict {sorted(named - kinds)} in monitoring/diagnose/verdicts.py"


def test_no_python_module_but_the_catalog_names_a_metric():
    written = []
    for directory in PYTHON_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            if path != CATALOG_FILE:
                written += [f"{path.relative_to(REPO)}: {name}" for name in METRIC_NAME.findall(path.read_text())]
    assert not written, "metric names written outside trainstack/catalog.py:\n" + "\n".join(written)
