"""Which metric names a PromQL expression reads, and whether they are documented: the other monitoring tests
check every rule and dashboard query against the series that exist. Here: the helpers themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where raw metric names are listed: training metrics in the architecture page, the exporter's in metrics.md.
METRIC_DOCS = (ROOT / "docs/architecture.md", ROOT / "docs/metrics.md")
# Series Prometheus itself writes.
PROMETHEUS_SERIES = {"up", "ALERTS"}

# Keywords and words that may stand before "(" without being a metric: everything followed by "(" is a function
# or an aggregation, so only the keywords that are not need listing.
_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"(?<![\w:])[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?(?![\w:])")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names an expression selects."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\boffset\s+\S+", " ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        followed_by_call = text[match.end():].lstrip().startswith("(")
        if not followed_by_call and match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def label_values_metric(query: str) -> tuple[str, str]:
    """A Grafana `label_values(selector, label)` variable query -> (selector, label)."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    if not match:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return match.group(1).strip(), match.group(2)


def undocumented(names: set[str]) -> set[str]:
    """The raw metric names (no `:`, so not recorded series) that no metric reference lists."""
    text = "\n".join(path.read_text() for path in METRIC_DOCS if path.is_file())
    return {name for name in names if ":" not in name and name not in PROMETHEUS_SERIES
            and f"`{re.sub(r'_(bucket|sum|count)$', '', name)}`" not in text}


@pytest.mark.parametrize(("expr", "names"), [
    ("rate(trainstack_train_steps_total[2m])", {"trainstack_train_steps_total"}),
    ('histogram_quantile(0.9, sum by (job, le) (rate(trainstack_train_step_duration_seconds_bucket{job=~"$job"}'
     "[$__rate_interval])))", {"trainstack_train_step_duration_seconds_bucket"}),
    ("rank:a:rate2m / on (job) group_left () (quantile by (job) (0.5, rank:a:rate2m) > 0)", {"rank:a:rate2m"}),
    ('trainstack_gpu_utilization_ratio < 0.05 unless on (job, instance, uuid) trainstack_train_rank_info',
     {"trainstack_gpu_utilization_ratio", "trainstack_train_rank_info"}),
    ("increase(x_total[10m]) > 0 or (x_total > 1e3 unless x_total offset 10m)", {"x_total"}),
    ('sum by (reason) (m{reason!="gpu_idle", job=~"a|b"}) and bool 1', {"m"}),
    ('ALERTS{alertname=~"Trainstack.*"}', {"ALERTS"}),
    ("time() - max by (job) (ts > 0)", {"ts"}),
    ("avg_over_time(clock{reason=~\"x\"}[2m]) < 0.8 * clock_max", {"clock", "clock_max"}),
])
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_label_values_metric() -> None:
    assert label_values_metric('label_values(trainstack_gpu_info{job=~"$job"}, gpu)') == (
        'trainstack_gpu_info{job=~"$job"}', "gpu")
    with pytest.raises(ValueError):
        label_values_metric("query_result(up)")


def test_undocumented() -> None:
    assert undocumented({"trainstack_train_step_duration_seconds_bucket", "trainstack_train_rank_info", "up",
                         "rank:x:rate2m"}) == set()
    assert undocumented({"trainstack_train_no_such_metric"}) == {"trainstack_train_no_such_metric"}
