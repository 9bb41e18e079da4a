"""Grafana: the committed dashboards are what build_dashboards.py builds, every panel is a modern panel with a
unit and a description, queries honour the dashboard's variables and read series that exist, and the
provisioning wires the dashboards to the datasource they default to."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers.promql import undocumented
from tests.helpers.runs import REPO as ROOT
from trainstack.monitoring.promql import label_values_metric, metric_names

GRAFANA_DIR = ROOT / "monitoring/grafana"
DASHBOARD_FILES = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
RECORDING_RULES = ROOT / "monitoring/prometheus/rules/recording.yml"


def dashboards() -> list[dict]:
    return [json.loads(path.read_text()) for path in DASHBOARD_FILES]


def panels(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def recorded_series() -> set[str]:
    return {
        rule["record"] for group in yaml.safe_load(RECORDING_RULES.read_text())["groups"] for rule in group["rules"]
    }


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d["uid"])
def test_every_panel_is_a_timeseries_or_stat_with_a_unit_and_a_description(dashboard: dict) -> None:
    for panel in panels(dashboard):
        assert panel["type"] in {"timeseries", "stat"}, panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']} has no unit"
        assert panel["description"].strip(), f"{panel['title']} has no description"
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("title", ["Alerts", "Hang evidence"])
def test_panels_that_list_what_is_there_now_query_the_present_only(title: str) -> None:
    # Over the dashboard's range, lastNotNull would list an alert that resolved, or a stall the exporter replaced
    # with the age it had then, beside the ones there now.
    found = [panel for dashboard in dashboards() for panel in panels(dashboard) if panel["title"] == title]
    assert found and all(t["instant"] and not t["range"] for panel in found for t in panel["targets"]), title


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d["uid"])
def test_variables_select_job_instance_gpu_and_rank(dashboard: dict) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance", "gpu", "rank"} <= variables.keys()
    for name in ("job", "instance", "gpu", "rank"):
        assert variables[name]["includeAll"] and variables[name]["multi"] and variables[name]["allValue"] == ".*"
        label_values_metric(variables[name]["definition"])
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"], f"{panel['title']}: query ignores the job variable"


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d["uid"])
def test_queries_read_recorded_or_documented_series(dashboard: dict) -> None:
    recorded = recorded_series()
    for panel in panels(dashboard):
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert {n for n in names if ":" in n} <= recorded, f"{panel['title']}: not a recording rule"
            assert not undocumented(names), f"{panel['title']}: not in docs/architecture.md or docs/metrics.md"


def test_provisioning_points_the_dashboards_at_the_provisioned_datasource() -> None:
    sources = yaml.safe_load((GRAFANA_DIR / "provisioning/datasources/trainstack.yml").read_text())["datasources"]
    providers = yaml.safe_load((GRAFANA_DIR / "provisioning/dashboards/trainstack.yml").read_text())["providers"]
    assert [s["type"] for s in sources] == ["prometheus"]
    assert [p["type"] for p in providers] == ["file"] and providers[0]["options"]["path"]
    for dashboard in dashboards():
        variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
        assert variable["current"]["value"] == sources[0]["uid"]
