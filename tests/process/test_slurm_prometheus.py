"""Each node's exporter under a real Slurm (tests/helpers/slurm.py's two-node cluster), and a real Prometheus finding
them: a 2-node `trainstack train` job submitted with examples/slurm/multi-node.sbatch, one CPU rank per node and no
exporter port given, so each node's launcher derives its own from the job id and its node rank (both nodes share
this host) and writes its exporter as a file_sd target into the job's folder; a Prometheus started here, inside the
cluster's namespace, with examples/slurm/prometheus.yml pointed at that folder, discovers both and scrapes them.
The job is then stopped as the time limit's warning stops it (`scancel --batch --signal=TERM`: checkpoint, exit 75,
MAX_SEGMENTS=0 so that it is not requeued), and the target files are gone.

The exporters and Prometheus listen on the namespace's loopback only: this process reads them through
`nsenter --net=` (a Python one-liner per request). About 30 s on 2 shared cores."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from tests.helpers.runs import REPO
from tests.helpers.slurm import SlurmCluster, cluster_or_skip, end, submit_multi_node
from trainstack.slurm import exporter_port_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus not found: install Debian's `prometheus` package (make system-deps)",
    ),
]

PROMETHEUS = "http://127.0.0.1:9090"  # the namespace's own port: nothing else listens there
DONE = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
RANK = re.compile(r'^trainstack_train_\w+\{[^}]*\brank="(\d+)"', re.MULTILINE)
T = TypeVar("T")


@dataclass
class Job:
    job_id: str
    output: Path
    run_dir: Path
    targets: Path
    slurm: SlurmCluster
    prometheus: subprocess.Popen
    prometheus_log: Path

    def get(self, url: str) -> str | None:
        """The body at `url`, fetched inside the cluster's namespace; None when nothing answers there (yet)."""
        done = self.slurm.run([sys.executable, "-c", FETCH, url], check=False, timeout=20)
        return done.stdout if done.returncode == 0 else None

    def query(self, expr: str) -> list[dict]:
        body = self.get(f"{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        return json.loads(body)["data"]["result"] if body else []

    def eventually(self, read: Callable[[], T], good: Callable[[T], bool], what: str, timeout: float = 90) -> T:
        """Read until `good` holds; fails naming `what`, with the job's and Prometheus' last lines, after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            found = read()
            if good(found):
                return found
            if time.monotonic() > deadline or self.prometheus.poll() is not None:
                output = self.output.read_text()[-3000:] if self.output.exists() else ""
                pytest.fail(
                    f"{what}: last read {found!r}\n--- job\n{output}\n--- prometheus\n"
                    f"{self.prometheus_log.read_text()[-2000:]}"
                )
            time.sleep(0.5)

    def target_files(self) -> dict[str, list[dict]]:
        return {path.name: json.loads(path.read_text()) for path in sorted(self.targets.glob("*.json"))}


def prometheus_config(folder: Path, targets: Path) -> Path:
    """examples/slurm/prometheus.yml as a user adapts it: its target files are `targets`, every interval 1 s, no rules
    (tests/infra/test_monitoring_prometheus.py checks those)."""
    config = yaml.safe_load((REPO / "examples/slurm/prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    del config["rule_files"]
    (scrape,) = config["scrape_configs"]
    (discovery,) = scrape["file_sd_configs"]
    discovery.update(files=[f"{targets}/*.json"], refresh_interval="1s")
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[Job]:
    folder = tmp_path_factory.mktemp("slurm-prometheus")
    with cluster_or_skip(folder / "cluster") as slurm:
        targets = folder / "targets"
        output, run_dir = folder / "out.txt", folder / "run"
        job_id = submit_multi_node(
            slurm,
            output,
            run_dir,
            *("--max-steps", "100000", "--log-every", "5"),  # trains until the test stops it
            exporters=True,
            PROMETHEUS_SD_DIR=str(targets),
            MAX_SEGMENTS="0",  # stopped with a checkpoint, it is not requeued
        )
        log = folder / "prometheus.log"
        with log.open("w") as sink:
            command = [
                "prometheus",
                f"--config.file={prometheus_config(folder, targets)}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={PROMETHEUS.removeprefix('http://')}",
            ]
            prometheus = subprocess.Popen(slurm.in_namespace(command), stdout=sink, stderr=subprocess.STDOUT)
        try:
            yield Job(job_id, output, run_dir, targets, slurm, prometheus, log)
        finally:
            end(prometheus)


def test_each_node_serves_its_own_rank_on_its_own_derived_port(job):
    files = job.eventually(job.target_files, lambda found: len(found) == 2, "both nodes' target files")
    run_id = f"slurm-{job.job_id}-0"
    assert sorted(files) == [f"{run_id}-node0.json", f"{run_id}-node1.json"]
    for node, name in enumerate(("n1", "n2")):
        (entry,) = files[f"{run_id}-node{node}.json"]
        (target,) = entry["targets"]
        host, port = target.rsplit(":", 1)
        # Both nodes are on this host: the job id alone would give them one port; the node's rank tells them apart.
        assert int(port) == exporter_port_of(int(job.job_id), node)
        # --exporter-host 0.0.0.0 (the script's) is no address to connect to: the target names this host, which
        # resolves to loopback here, as a cluster's node names resolve on its other hosts.
        assert host == socket.gethostname()
        assert entry["labels"] == {
            "trainstack_run_id": run_id,
            "node_rank": str(node),
            "slurm_job_id": job.job_id,
            "slurm_node": name,
        }
        # The node's exporter serves its own rank (rank k on node k: one rank per node), and no other node's.
        text = job.eventually(
            lambda target=target: job.get(f"http://{target}/metrics") or "",
            lambda text: bool(RANK.findall(text)),
            f"node {node}'s rank on its exporter {target}",
        )
        assert set(RANK.findall(text)) == {str(node)}


def test_prometheus_discovers_both_exporters_from_the_files_and_scrapes_them(job):
    up = job.eventually(
        lambda: {(r["metric"]["slurm_node"], r["value"][1]) for r in job.query('up{job="trainstack"}')},
        lambda found: found == {("n1", "1"), ("n2", "1")},
        "up == 1 for both nodes' exporters",
    )
    assert up == {("n1", "1"), ("n2", "1")}
    # The ranks' own series keep their labels beside the targets' (no exported_rank): each node's rank under its node.
    ranks = job.eventually(
        lambda: {(r["metric"]["slurm_node"], r["metric"].get("rank")) for r in job.query("trainstack_train_rank_info")},
        lambda found: len(found) == 2,
        "both ranks' info series in Prometheus",
    )
    assert ranks == {("n1", "0"), ("n2", "1")}


def test_the_files_are_gone_once_the_job_stopped_with_a_checkpoint(job):
    job.slurm.run(["scancel", "--batch", "--signal=TERM", job.job_id])
    fields = job.slurm.wait_job(job.job_id, DONE, timeout=120)
    text = job.output.read_text()
    assert fields["ExitCode"] == "75:0", text[-3000:]  # both nodes checkpointed and exited 75; not requeued
    assert fields["Restarts"] == "0"
    assert json.loads((job.run_dir / "summary.json").read_text())["exit_reason"] == "preempted"
    # Both nodes' ranks are in the run directory too, each node's metrics in its own folder.
    assert sorted(path.name for path in (job.run_dir / "telemetry").iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert sorted(path.name for path in (job.run_dir / "metrics").iterdir()) == ["node-0", "node-1"]
    assert sorted(path.name for path in job.targets.iterdir()) == []  # nor a temporary file left
    assert len(re.findall(r"Prometheus target \S+:\d+ in ", text)) == 2, text[-3000:]  # each node said where
    # Prometheus drops them at its next reading of the folder.
    active = job.eventually(
        lambda: json.loads(job.get(f"{PROMETHEUS}/api/v1/targets") or '{"data": {"activeTargets": [0]}}')["data"][
            "activeTargets"
        ],
        lambda found: found == [],
        "Prometheus dropping both targets",
    )
    assert active == []
