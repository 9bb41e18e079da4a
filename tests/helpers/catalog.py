"""The catalog's names: every sample a metric writes and every recorded series, and the names it lacks."""

from __future__ import annotations

from trainstack import catalog
from trainstack.monitoring.promql import PROMETHEUS_SERIES

SAMPLES = {sample: metric for metric in catalog.METRICS for sample in metric.sample_names}
RECORDED = {series.name: series for series in catalog.RECORDED}


def unknown(names: set[str]) -> set[str]:
    return {name for name in names if name not in SAMPLES and name not in RECORDED and name not in PROMETHEUS_SERIES}
