"""Which metric names a PromQL expression reads: the rule files' and dashboards' queries, read back as data."""

from __future__ import annotations

import re

# Series Prometheus itself writes.
PROMETHEUS_SERIES = {"up", "ALERTS"}


# Keywords and words that may stand before "(" without being a metric: everything followed by "(" is a function
# or an aggregation, so only the keywords that are not need listing.
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "inf",
    "nan",
}


STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


NUMBER = re.compile(r"(?<![\w:])[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?(?![\w:])")


IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names an expression selects."""
    text = STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\boffset\s+\S+", " ", text)
    text = GROUPING.sub(" ", text)
    text = NUMBER.sub(" ", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        followed_by_call = text[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


def label_values_metric(query: str) -> tuple[str, str]:
    """A Grafana `label_values(selector, label)` variable query -> (selector, label)."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    if not match:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return match.group(1).strip(), match.group(2)
