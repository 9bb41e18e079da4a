"""The Prometheus text format 0.0.4, written for the exporter's per-scrape CPU budget.

prometheus_client's `generate_latest` escapes and validates every label name and value of every sample at every
scrape: with 8 GPUs and 8 ranks (~530 series) that was 3-4 ms, a quarter of a scrape's CPU. `TextEncoder` writes
the same bytes (tests/test_exporter_exposition.py compares them) but renders a series' label set once and reuses
the text while the series exists, so a sample costs a dictionary lookup and a float format. The metric families
still come from prometheus_client collectors; the escaping rules are prometheus_client's own functions
(through trainstack/promcompat.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from trainstack import promcompat

# OpenMetrics family type -> (suffix of the exposed name, text-format type), as generate_latest maps them.
TEXT_TYPES = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
# Label sets come and go with runs, pids and Xid codes; past this many the cache starts again from empty.
MAX_CACHED_LABEL_SETS = 20_000


class TextEncoder:
    """Encodes a registry's collection; one instance per endpoint, safe to share between request threads."""

    def __init__(self):
        self._names: dict[str, str] = {}
        self._label_sets: dict[tuple, str] = {}

    def encode(self, registry: CollectorRegistry) -> bytes:
        lines = []
        for metric in registry.collect():
            suffix, text_type = TEXT_TYPES.get(metric.type, ("", metric.type))
            name = self._name(metric.name + suffix)
            documentation = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            lines.append(f"# HELP {name} {documentation}\n# TYPE {name} {text_type}\n")
            for sample in metric.samples:
                timestamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
                lines.append(f"{self._name(sample.name)}{self._labels(sample.labels)} "
                             f"{promcompat.sample_value(sample.value)}{timestamp}\n")
        return "".join(lines).encode()

    def _name(self, name: str) -> str:
        escaped = self._names.get(name)
        if escaped is None:
            escaped = self._names[name] = promcompat.metric_name(name)
        return escaped

    def _labels(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        text = self._label_sets.get(key)
        if text is None:
            if len(self._label_sets) >= MAX_CACHED_LABEL_SETS:
                self._label_sets.clear()
            pairs = ",".join(f'{promcompat.label_name(k)}="{_escape_value(v)}"'
                             for k, v in sorted(labels.items()))
            text = self._label_sets[key] = f"{{{pairs}}}" if pairs else ""
        return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
