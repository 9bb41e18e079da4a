"""The exporter's text encoder writes exactly what prometheus_client's generate_latest writes, byte for byte.

Both encoders read the same collected families (a registry is collected once and replayed), so counters that rise
between scrapes cannot make them differ; what is compared is only the encoding.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    UnknownMetricFamily,
)

import trainstack.monitoring.exporter.exposition as exposition
import trainstack.monitoring.nvml_fake as fake
from tests.standin_ranks import write_rank
from trainstack.monitoring.exporter.app import build_registry, build_sampler
from trainstack.monitoring.exporter.config import ExporterConfig
from trainstack.monitoring.exporter.exposition import TextEncoder
from trainstack.monitoring.exporter.nvml import NvmlSession


class Replay:
    """A collector that yields the same families every time."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def registry_of(families: list[Metric]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Replay(families))
    return registry


@pytest.mark.slow
def test_the_exporters_own_scrape_encodes_identically(tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    pids = [write_rank(metrics_dir, rank, steps=50, on_gpu=True, world_size=2) for rank in range(2)]
    host = json.loads((fake.DATA_DIR / "hosts" / "mixed.json").read_text())
    host["processes"] = {"0": [{"pid": pids[0], "used_gpu_memory": 1 << 30}]}
    host["xid_events"] = [{"gpu": 2, "xid": 79, "after_seconds": 0}]
    fake.load(host)
    try:
        session = NvmlSession(fake)
        config = ExporterConfig(port=0, nvml_module="trainstack.monitoring.nvml_fake", metrics_dir=metrics_dir)
        sampler = build_sampler(config, session)
        sampler.sample_now()
        registry = build_registry(config, sampler)
        families = list(registry.collect())
        session.close()
    finally:
        fake.load(None)
    names = {family.name for family in families}
    assert {"trainstack_gpu_power_watts", "trainstack_train_step_duration_seconds", "trainstack_gpu_xid_errors",
            "trainstack_gpu_process_memory_used_bytes", "trainstack_exporter_nvml_errors",
            "trainstack_exporter_gpu_sample_age_seconds", "trainstack_exporter_gpu_sample_cpu_seconds"} <= names
    replay = registry_of(families)
    encoder = TextEncoder()
    for _ in range(2):  # the second time from the label cache
        assert encoder.encode(replay) == generate_latest(replay)


def awkward_families() -> list[Metric]:
    gauge = GaugeMetricFamily("odd_values", "Help with a \\ backslash\nand a newline.", labels=["a", "b"])
    for i, number in enumerate([0.0, -0.0, 1.0, -1.5, 1e6, 1234567.0, 1e22, 3.3e-7, 12345678901234567890.0,
                                math.inf, -math.inf, math.nan, 2**53, -(2**60)]):
        gauge.add_metric([str(i), "x"], number)
    gauge.add_metric(['quote " here', "back\\slash"], 1)
    gauge.add_metric(["new\nline", "ünïcödé ✓"], 2)
    gauge.add_metric(["", "empty first"], 3)
    stamped = GaugeMetricFamily("stamped", "With timestamps.", labels=["k"])
    stamped.add_metric(["v"], 1.0, timestamp=1700000000.123)
    stamped.add_metric(["w"], 2.0, timestamp=1700000000)
    counter = CounterMetricFamily("things", "Counted.", labels=["z", "a"])  # labels written sorted
    counter.add_metric(["last", "first"], 7)
    histogram = HistogramMetricFamily("waits_seconds", "A histogram.", labels=["rank"])
    histogram.add_metric(["0"], buckets=[("0.1", 1), ("1.0", 3), ("+Inf", 4)], sum_value=2.5)
    info = InfoMetricFamily("build", "Build facts.")
    info.add_metric([], {"version": "1.2.3", "commit": "abc"})
    state = StateSetMetricFamily("mode", "A state set.", value={"on": True, "off": False})
    unknown = UnknownMetricFamily("mystery", "Untyped.", value=4.0)
    unlabelled = GaugeMetricFamily("plain", "No labels.", value=5)
    dotted = GaugeMetricFamily("has.dot:colon", "A name outside the legacy character set.", labels=["label-x"])
    dotted.add_metric(["1"], 6)
    return [gauge, stamped, counter, histogram, info, state, unknown, unlabelled, dotted,
            GaugeMetricFamily("empty_family", "No samples.", labels=["a"])]


def test_awkward_names_labels_and_values_encode_identically():
    replay = registry_of(awkward_families())
    encoder = TextEncoder()
    for _ in range(2):
        assert encoder.encode(replay) == generate_latest(replay)


def test_randomised_label_sets_past_the_cache_limit_encode_identically(monkeypatch):
    monkeypatch.setattr(exposition, "MAX_CACHED_LABEL_SETS", 7)
    rng = random.Random(20261122)
    alphabet = 'ab"\\\n é_-.{}=,'
    encoder = TextEncoder()
    for _ in range(20):
        family = GaugeMetricFamily("churn", "Label sets that come and go.", labels=["pid", "value"])
        for _ in range(rng.randrange(1, 15)):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
            family.add_metric([str(rng.randrange(100)), text], rng.uniform(-1e9, 1e9))
        replay = registry_of([family])
        assert encoder.encode(replay) == generate_latest(replay)
    assert len(encoder._label_sets) <= 7
