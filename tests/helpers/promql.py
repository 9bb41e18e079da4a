"""Which metric names the docs do not list (reading names out of PromQL: trainstack/monitoring/promql.py)."""

from __future__ import annotations

import re

from tests.helpers.runs import REPO
from trainstack.monitoring.promql import PROMETHEUS_SERIES

# Where raw metric names are listed: training metrics in the architecture page, the exporter's in metrics.md.
METRIC_DOCS = (REPO / "docs/architecture.md", REPO / "docs/metrics.md")


def undocumented(names: set[str]) -> set[str]:
    """The raw metric names (no `:`, so not recorded series) that no metric reference lists."""
    text = "\n".join(path.read_text() for path in METRIC_DOCS if path.is_file())
    return {
        name
        for name in names
        if ":" not in name
        and name not in PROMETHEUS_SERIES
        and f"`{re.sub(r'_(bucket|sum|count)$', '', name)}`" not in text
    }
