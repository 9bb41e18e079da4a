"""The watched command's state, kept by `trainstack watch` in its node's metrics folder and served by the exporter
(monitoring/exporter/watched.py): its command line and how many of its processes run; nothing where watch runs
nothing (trainstack train, an exporter started alone)."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainstack import catalog
from trainstack.commands.watch import CommandState
from trainstack.monitoring.exporter.watched import WatchedCommandCollector


def served(metrics_dir) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WatchedCommandCollector(metrics_dir))
    text = generate_latest(registry).decode()
    return {
        sample.name: (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_command_and_its_running_processes_are_served_as_watch_last_counted_them(tmp_path):
    state = CommandState(tmp_path, ["torchrun", "--nproc-per-node", "2", "train.py"], "run-1")
    state.running(3)
    assert served(tmp_path) == {
        catalog.WATCH_COMMAND_INFO.name: ({"command": "torchrun --nproc-per-node 2 train.py", "run_id": "run-1"}, 1.0),
        catalog.WATCH_COMMAND_PROCESSES.name: ({}, 3.0),
    }
    state.running(0)  # the command ended
    assert served(tmp_path)[catalog.WATCH_COMMAND_PROCESSES.name] == ({}, 0.0)


def test_nothing_is_served_where_watch_runs_nothing(tmp_path):
    assert served(tmp_path) == {} and served(None) == {}
