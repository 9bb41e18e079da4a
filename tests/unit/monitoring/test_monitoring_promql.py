"""Which metric names a PromQL expression reads, and whether they are documented: the other monitoring tests
check every rule and dashboard query against the series that exist. Here: the helpers themselves."""

from __future__ import annotations

import pytest

from tests.helpers.promql import undocumented
from trainstack.monitoring.promql import label_values_metric, metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("rate(trainstack_train_steps_total[2m])", {"trainstack_train_steps_total"}),
        (
            'histogram_quantile(0.9, sum by (job, le) (rate(trainstack_train_step_duration_seconds_bucket{job=~"$job"}'
            "[$__rate_interval])))",
            {"trainstack_train_step_duration_seconds_bucket"},
        ),
        ("rank:a:rate2m / on (job) group_left () (quantile by (job) (0.5, rank:a:rate2m) > 0)", {"rank:a:rate2m"}),
        (
            "trainstack_gpu_utilization_ratio < 0.05 unless on (job, instance, uuid) trainstack_train_rank_info",
            {"trainstack_gpu_utilization_ratio", "trainstack_train_rank_info"},
        ),
        ("increase(x_total[10m]) > 0 or (x_total > 1e3 unless x_total offset 10m)", {"x_total"}),
        ('sum by (reason) (m{reason!="gpu_idle", job=~"a|b"}) and bool 1', {"m"}),
        ('ALERTS{alertname=~"Trainstack.*"}', {"ALERTS"}),
        ("time() - max by (job) (ts > 0)", {"ts"}),
        ('avg_over_time(clock{reason=~"x"}[2m]) < 0.8 * clock_max', {"clock", "clock_max"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_label_values_metric() -> None:
    assert label_values_metric('label_values(trainstack_gpu_info{job=~"$job"}, gpu)') == (
        'trainstack_gpu_info{job=~"$job"}',
        "gpu",
    )
    with pytest.raises(ValueError):
        label_values_metric("query_result(up)")


def test_undocumented() -> None:
    assert (
        undocumented(
            {"trainstack_train_step_duration_seconds_bucket", "trainstack_train_rank_info", "up", "rank:x:rate2m"}
        )
        == set()
    )
    assert undocumented({"trainstack_train_no_such_metric"}) == {"trainstack_train_no_such_metric"}
