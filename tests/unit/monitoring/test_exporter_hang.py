"""The latest stall's verdict served by the exporter beside the run (monitoring/exporter/hang.py,
catalog.HANG_EVIDENCE), so that diagnose from the exporter or Prometheus names where the ranks wait, without
--run-dir; nothing served while no stall has been collected, nor a stall of an earlier launch."""

import json
import os
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainstack import catalog
from trainstack.hang_verdict import latest_hang
from trainstack.monitoring.diagnose.snapshot import read_snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.monitoring.exporter.hang import HangCollector
from trainstack.rundir import RunDir, hang_pid_file
from trainstack.thresholds import Thresholds

HEADLINE = "rank 1 has not joined all_reduce #11 of process group 0 (rank 0 waits in it)"
FIX = "a collective under `if rank == 0:` runs on one rank only: run it on every rank"


def served(run_dir, metrics_dir=None) -> list:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HangCollector(run_dir, metrics_dir))
    text = generate_latest(registry).decode()
    return [
        (sample.labels, sample.value) for family in text_string_to_metric_families(text) for sample in family.samples
    ]


def collected_stall(run_dir, at: float, number: int = 1) -> None:
    stall = RunDir(run_dir).stall(number)
    stall.path.mkdir(parents=True)
    stall.verdict.write_text(
        json.dumps({"headline": HEADLINE, "evidence": ["rank 0: at train.py:40"], "fix": FIX, "culprits": [1]})
    )
    os.utime(stall.path, (at, at))


def test_nothing_is_served_without_a_run_directory_or_a_stall(tmp_path):
    assert served(None) == []
    assert served(tmp_path) == []


def test_the_latest_stalls_verdict_is_served_with_when_it_was_collected(tmp_path):
    collected_stall(tmp_path, 1_800_000_000.0)
    assert served(tmp_path) == [({"headline": HEADLINE, "culprits": "1", "fix": FIX}, 1_800_000_000.0)]


def test_a_stall_of_an_earlier_launch_is_not_served(tmp_path):
    """A rerun after a hang: until its first step, the earlier launch's evidence would read as this one hanging."""
    metrics = tmp_path / "metrics" / "node-0"
    metrics.mkdir(parents=True)
    registered = hang_pid_file(metrics, 0)
    registered.write_text('{"rank": 0, "pid": 1}')
    os.utime(registered, (1_800_000_100.0, 1_800_000_100.0))  # this launch's rank 0 registered at +100 s
    collected_stall(tmp_path, 1_800_000_000.0)
    assert served(tmp_path, metrics) == []
    assert latest_hang(tmp_path, RunDir(tmp_path).all_node_metrics()) is None  # diagnose --run-dir alike
    collected_stall(tmp_path, 1_800_000_200.0, number=2)  # this launch's own stall
    assert served(tmp_path, metrics) == [({"headline": HEADLINE, "culprits": "1", "fix": FIX}, 1_800_000_200.0)]


class Served:
    """A Source holding what the exporter served: two ranks that stopped stepping, and the stall's verdict."""

    description = "test"

    def __init__(self, now: float, last_step: float, hang: list):
        self.now = now
        self._instants = {
            catalog.TRAIN_STEPS.name: [({"rank": "0"}, 60.0), ({"rank": "1"}, 60.0)],
            catalog.TRAIN_LAST_STEP.name: [({"rank": "0"}, last_step), ({"rank": "1"}, last_step)],
            catalog.HANG_EVIDENCE.name: hang,
        }

    def instant(self, name: str) -> list:
        return self._instants.get(name, [])

    def rate(self, name: str) -> list:
        return []


def test_diagnose_names_the_rank_from_the_served_verdict_long_before_the_stall_threshold(tmp_path):
    collected_stall(tmp_path, time.time())
    now = time.time() + 5
    hang = served(tmp_path)
    (stalled,) = diagnose(read_snapshot(Served(now, now - 90, hang)), Thresholds())  # 90 s: under the 600 s one
    assert stalled.kind == "stalled" and HEADLINE in stalled.summary and FIX in stalled.fix
    # Evidence older than the last step is a stall the run came out of: nothing now.
    assert diagnose(read_snapshot(Served(now + 60, now + 50, hang)), Thresholds()) == []
