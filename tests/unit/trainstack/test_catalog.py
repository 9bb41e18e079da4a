"""The metric catalog (trainstack/catalog.py) against everything that reads a metric: every metric a recording
rule, alert, rule unit test, dashboard query or variable, or `trainstack diagnose` names is in the catalog, each
entry's `readers` are exactly what reads it, and the names follow the project's conventions (the producers, on a
live scrape of an exporter process: tests/process/test_catalog.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.catalog import RECORDED, SAMPLES, unknown
from tests.helpers.runs import REPO
from trainstack import catalog, problems, ratios
from trainstack.monitoring import metric_readers
from trainstack.monitoring.diagnose_readers import OUTPUTS, diagnose_readers
from trainstack.monitoring.metric_readers import queries
from trainstack.monitoring.promql import PROMETHEUS_SERIES, metric_names

RULE_TEST_FILES = sorted((REPO / "monitoring/prometheus/tests").glob("*.yml"))
DIAGNOSE_DIR = REPO / "monitoring/diagnose"
# Where a metric name may not be written outside the catalog (issue 11: one module names the metrics).
PYTHON_DIRS = ("train", "monitoring", "supervisor", "commands", "bench", "trainstack")
CATALOG_FILE = REPO / "trainstack/catalog.py"
METRIC_NAME = re.compile(r"(?<![\w:])trainstack_(?:train|gpu|exporter|watch)_[a-z0-9_]*")


def entry(name: str) -> catalog.Metric | catalog.Recorded:
    return SAMPLES.get(name) or RECORDED[name]


def test_names_follow_the_project_conventions():
    names = [metric.name for metric in catalog.METRICS] + list(RECORDED)
    assert len(names) == len(set(names)), "a name is in the catalog twice"
    for metric in catalog.METRICS:
        assert metric.name.startswith(catalog.PREFIXES[metric.source]), metric.name
        assert metric.name.endswith("_total") == (metric.type == catalog.COUNTER), metric.name
        assert metric.name.endswith("_info") == (metric.type == catalog.INFO or metric.values == "1"), metric.name
        assert bool(metric.buckets) == (metric.type == catalog.HISTOGRAM), metric.name
        assert metric.help.endswith(".") and metric.origin, metric.name
    for name, readers in metric_readers.readers().items():
        assert all(reader.split(" ", 1)[0] in metric_readers.READER_KINDS for reader in readers), name
    for series in catalog.RECORDED:
        level, base, operation = series.name.split(":")
        assert level in {"rank", "job", "gpu"} and base.startswith(catalog.PREFIX) and operation, series.name


@pytest.mark.parametrize(("reader", "expr"), queries(), ids=[reader for reader, _ in queries()])
def test_rules_and_dashboards_read_only_catalog_metrics(reader: str, expr: str):
    assert not unknown(metric_names(expr)), f"{reader} reads series trainstack/catalog.py lacks"


def test_the_recording_rules_record_the_catalogs_recorded_series():
    recorded = {rule["record"] for rule in metric_readers.rules() if "record" in rule}
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


# One row of a docs/metrics.md table: its series, then its "read by" cell, the last.
DOCS_ROW = re.compile(r"^\| `([^`]+)` \|.*\| ([^|]*) \|$", re.MULTILINE)
DOCS_READER_HEADINGS = {
    "rules": "record",
    "alerts": "alert",
    "panels": "panel",
    "dashboard variables": "variable",
    "diagnose": "diagnose",
}


def docs_readers() -> dict[str, set[str]]:
    """Series -> the rules, alerts, panels, variables and diagnose verdicts docs/metrics.md says read it."""
    named: dict[str, set[str]] = {}
    for name, cell in DOCS_ROW.findall((REPO / "docs/metrics.md").read_text()):
        for part in filter(None, cell.split("; ")):
            heading, _, readers = part.partition(": ")
            if heading in DOCS_READER_HEADINGS:
                named.setdefault(name, set()).update(
                    f"{DOCS_READER_HEADINGS[heading]} {reader.strip('`')}" for reader in readers.split(", ")
                )
    return named


def test_readers_are_what_the_rules_and_dashboards_read():
    actual: dict[str, set[str]] = {}
    for reader, expr in queries():
        for name in metric_names(expr) - PROMETHEUS_SERIES:
            actual.setdefault(entry(name).name, set()).add(reader)
    found = {name: set(readers) for name, readers in metric_readers.readers().items()}
    assert {name: {r for r in readers if not r.startswith("diagnose ")} for name, readers in found.items()} == {
        name: actual.get(name, set()) for name in found
    }
    for name, kinds in diagnose_readers().items():
        actual.setdefault(name, set()).update(f"diagnose {kind}" for kind in kinds)
    named = docs_readers()
    wrong = []
    for item in [*catalog.METRICS, *catalog.RECORDED]:
        declared = named.get(item.name, set())
        read_by = actual.get(item.name, set())
        if declared != read_by:
            wrong.append(f"{item.name}: add {sorted(read_by - declared)}, remove {sorted(declared - read_by)}")
    assert not wrong, "docs/metrics.md's readers differ from the rules, dashboards and diagnose:\n" + "\n".join(wrong)


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
    """The kinds verdicts.py writes: each Verdict's first argument, a kind constant of trainstack/problems.py."""
    tree = ast.parse((DIAGNOSE_DIR / "verdicts.py").read_text())
    return {
        getattr(problems, node.args[0].attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict"
    }


def test_diagnose_readers_are_what_diagnose_names():
    read = {getattr(catalog, name).name for path in DIAGNOSE_DIR.glob("*.py") for name in catalog_references(path)}
    read |= {name for path in DIAGNOSE_DIR.glob("*.py") for name in ratio_references(path)}
    found = diagnose_readers()
    assert read == set(found), (
        f"named by monitoring/diagnose, read by no verdict found in its code: "
        f"{sorted(read - set(found))}; found read but not named: {sorted(set(found) - read)}"
    )
    kinds = verdict_kinds() | set(OUTPUTS)
    assert len(kinds) > 5
    for name, named in found.items():
        assert set(named) <= kinds, (
            f"{name}: no verdict {sorted(set(named) - kinds)} in monitoring/diagnose/verdicts.py"
        )
    unseen = kinds - {kind for named in found.values() for kind in named}
    assert not unseen, f"monitoring/diagnose_readers.py finds no series read by {sorted(unseen)}"


@pytest.mark.parametrize(
    ("metric", "kind"),
    [
        (catalog.TRAIN_DATA_WAIT, "input-bound"),  # a ratio's series, through a RankView field
        (catalog.GPU_SM_ACTIVE, "gpu-underused"),  # a field filled by a `**{...}` of (field, metric) pairs
        (catalog.GPU_LINK_INFO, "comm-bound"),  # fields named by a catalog tuple (GPU_LINK_LABELS)
        (catalog.EXPORTER_GPU_SAMPLES, "throttled"),  # the exporter source's slow reads time the violation counters
        (catalog.GPU_PROCESS_MEMORY_USED, "one-process-many-gpus"),  # through a Snapshot method (gpus_held)
        (catalog.TRAIN_STEPS, "no-training"),  # which ranks exist
        (catalog.WATCH_COMMAND_PROCESSES, "notes"),  # what diagnose shows besides the verdicts
    ],
)
def test_diagnose_readers_follow_each_field_to_the_verdicts(metric, kind):
    assert kind in diagnose_readers()[metric.name]


def test_diagnose_readers_leave_out_what_a_verdict_does_not_read():
    readers = diagnose_readers()
    assert "input-bound" not in readers[catalog.GPU_SM_ACTIVE.name]
    assert "throttled" not in readers[catalog.EXPORTER_GPU_SAMPLE_INTERVAL.name]


def test_no_python_module_but_the_catalog_names_a_metric():
    written = []
    for directory in PYTHON_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            if path != CATALOG_FILE:
                written += [f"{path.relative_to(REPO)}: {name}" for name in METRIC_NAME.findall(path.read_text())]
    assert not written, "metric names written outside trainstack/catalog.py:\n" + "\n".join(written)
