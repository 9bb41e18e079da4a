"""supervisor/prometheus_sd.py: the Prometheus file_sd target a node's exporter is announced by, its format, its
atomic write and its removal. No process: tests/process/test_slurm_prometheus.py has a real Prometheus read it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

import trainstack.write_failure
from trainstack.errors import ConfigError
from trainstack.slurm import SlurmWorld, expand_hostlist
from trainstack.supervisor.exporter_process import SupervisedExporter
from trainstack.supervisor.prometheus_sd import file_sd_target, target_host


def no_warning(line: str) -> None:
    pytest.fail(f"warned: {line}")


SLURM = SlurmWorld.from_environ(
    {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2"},
    expand=expand_hostlist,
)


def test_the_file_is_prometheus_file_sd_naming_the_run_the_job_and_the_node(tmp_path):
    target = file_sd_target(tmp_path / "sd", "slurm-4242-0", 1, "10.0.0.7", 25017, SLURM, no_warning)
    assert target is not None
    target.write()
    assert target.path == tmp_path / "sd" / "slurm-4242-0-node1.json"
    assert json.loads(target.path.read_text()) == [
        {
            "targets": ["10.0.0.7:25017"],
            "labels": {
                "trainstack_run_id": "slurm-4242-0",
                "node_rank": "1",
                "slurm_job_id": "4242",
                "slurm_node": "n2",
            },
        }
    ]
    # Labels the exporter's own series carry would rename those to exported_* and break the dashboards' queries.
    assert not {"run_id", "node", "rank", "job", "instance"} & set(json.loads(target.path.read_text())[0]["labels"])


def test_outside_slurm_the_labels_name_the_run_and_the_node_only(tmp_path):
    target = file_sd_target(tmp_path, "20260101-000000-abcdef", 0, "0.0.0.0", 9450, None, no_warning)
    assert target is not None
    assert target.labels == {"trainstack_run_id": "20260101-000000-abcdef", "node_rank": "0"}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1", "localhost", "LOCALHOST"])
def test_an_exporter_bound_to_loopback_is_announced_with_a_warning(tmp_path, host):
    said = []
    assert file_sd_target(tmp_path, "run", 0, host, 9450, None, said.append) is not None
    assert len(said) == 1 and f"--exporter-host {host} is reachable from this node only" in said[0]
    assert "--exporter-host 0.0.0.0" in said[0]


def test_an_exporter_bound_to_every_address_is_reached_by_this_hosts_name():
    assert target_host("0.0.0.0") == socket.gethostname()
    assert target_host("::") == socket.gethostname()
    assert target_host("node7.cluster") == "node7.cluster"
    assert target_host("fd00::7") == "[fd00::7]"


def test_the_file_is_written_atomically_under_a_name_the_pattern_never_matches(tmp_path, monkeypatch):
    target = file_sd_target(tmp_path, "run", 0, "10.0.0.7", 25000, None, no_warning)
    assert target is not None
    target.path.write_text("[]")  # the previous version Prometheus may be reading
    renames = []
    replace = os.replace

    def watched_replace(source, destination):
        renames.append((Path(source).name, Path(destination).read_text(), list(Path(source).parent.glob("*.json"))))
        replace(source, destination)

    monkeypatch.setattr(trainstack.write_failure.os, "replace", watched_replace)
    target.write()
    # Until the rename, the file Prometheus reads is the old one whole, and the half-written one is not *.json.
    assert renames == [("run-node0.json.tmp", "[]", [target.path])]
    assert json.loads(target.path.read_text())[0]["targets"] == ["10.0.0.7:25000"]


def test_removed_once_and_again_without_complaint(tmp_path):
    target = file_sd_target(tmp_path, "run", 0, "10.0.0.7", 25000, None, no_warning)
    assert target is not None
    target.write()
    target.remove()
    assert list(tmp_path.iterdir()) == []
    target.remove()  # never written, or already removed


def test_no_file_without_a_folder_or_without_an_exporter(tmp_path):
    assert file_sd_target(None, "run", 0, "0.0.0.0", 25000, SLURM, no_warning) is None
    assert file_sd_target(tmp_path / "sd", "run", 0, "0.0.0.0", 0, SLURM, no_warning) is None
    assert not (tmp_path / "sd").exists()


def test_a_run_id_is_made_safe_as_a_file_name(tmp_path):
    target = file_sd_target(tmp_path, "a/b c", 3, "h", 1, None, no_warning)
    assert target is not None and target.path.name == "a_b_c-node3.json"


def test_a_folder_that_cannot_be_made_is_one_line_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError) as error:
        file_sd_target(tmp_path / "file" / "sd", "run", 0, "0.0.0.0", 25000, None, no_warning)
    assert str(error.value).startswith(f"--prometheus-sd-dir {tmp_path / 'file' / 'sd'}: cannot create it")
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        file_sd_target(tmp_path / "file", "run", 0, "0.0.0.0", 25000, None, no_warning)


def test_a_target_folder_removed_while_the_run_goes_on_costs_the_discovery_only(tmp_path):
    """docs/slurm.md has users delete stale target files: one that deletes the folder itself must not end the
    exporter's supervision (its thread) with a traceback."""
    target = file_sd_target(tmp_path / "targets", "run", 0, "127.0.0.1", 9450, None, lambda line: None)
    (tmp_path / "targets").rmdir()
    said: list[str] = []
    exporter = SupervisedExporter([], {}, 9450, "127.0.0.1", "", said.append, discovery=target)
    exporter._announce()
    assert len(said) == 1 and said[0].startswith("warning: Prometheus will not find this exporter:"), said
