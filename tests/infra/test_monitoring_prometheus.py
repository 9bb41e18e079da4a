"""The rules and dashboards against a real Prometheus (Debian's package: its own instance on 127.0.0.1, its own
port and data directory, started and stopped here by PID).

It scrapes three real exporters, each its own scrape job:
- `trainstack`: a real 2-rank CPU training run (`trainstack train`, which starts its own exporter) whose loader
  sleeps per sample: input-bound, and nothing else;
- `trainstack-slowed`: the same with a model whose forward also sleeps on rank 1;
- `trainstack-fake-gpu`: the exporter on the NVML fake (four GPUs of different models) serving a synthetic rank
  that the trainer's own telemetry code writes as if it ran on GPU 0 with a known peak, so the GPU-only series
  (MFU, the rank-to-GPU join) exist too.
Prometheus loads the project's prometheus.yml (intervals shortened to 1s) and rule files; then every recording rule
and every dashboard query must return data and read only metrics the exporters produce, the slowed run must show a
data-wait ratio above the input-bound threshold, its slowed rank must be named the straggler, and diagnose must call
the input-bound run input-bound through its exporter and through Prometheus alike.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.fakes import LIMITS, kinds
from tests.helpers.runs import REPO as ROOT
from tests.helpers.runs import kill_tree
from tests.helpers.scrapes import diagnose_url
from trainstack import thresholds
from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring.diagnose.snapshot import read_snapshot
from trainstack.monitoring.diagnose.sources import PrometheusSource
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.monitoring.promql import PROMETHEUS_SERIES, label_values_metric, metric_names
from trainstack.rundir import RunDir, StallDir, free_port

PROMETHEUS_DIR = ROOT / "monitoring/prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
DASHBOARD_FILES = sorted((ROOT / "monitoring/grafana/dashboards").glob("*.json"))
FAKE_HOST = ROOT / "monitoring/nvml_fake/hosts/mixed.json"
FAKE_RUN_STALL = {
    "headline": "rank 1 has not joined all_reduce #26 of process group 0 (rank 0 waits in it); rank 1 is at "
    "train.py:40 in `evaluate`",
    "evidence": [],
    "fix": "call the collective on every rank",
    "culprits": [1],
}
TRAINSTACK = Path(sys.executable).with_name("trainstack")

INPUT_BOUND, SLOWED, FAKE_GPU = "trainstack", "trainstack-slowed", "trainstack-fake-gpu"
SLOW_RANK = "1"
# How long after the stack starts it may take to show what is asked: a limit on waiting, never a measured speed.
# Once it has passed, each check reads once, so a broken stack fails in seconds per check, not minutes.
DEADLINE_SECONDS = 150

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus not found: install Debian's `prometheus` package (make system-deps)",
    ),
]

# A rank that is not a training run: the trainer's telemetry module writing one rank's files as if it trained on
# the fake's GPU 0 with a known peak FLOP/s, which a CPU run never has.
SYNTHETIC_RANK = """
import sys, time
from pathlib import Path
import torch
from trainstack.monitor import Monitor
from trainstack.telemetry.device import RankIdentity
identity = RankIdentity(rank=0, local_rank=0, node="fake-gpu-node", uuid=sys.argv[2], run_id="synthetic",
                        world_size=1, nodes=1, mixed_precision="bf16", model="builtin:tiny-gpt",
                        dataset="builtin:sequences")
monitor = Monitor(Path(sys.argv[1]), identity, flops_per_token=6e6, peak=1e12, device=torch.device("cpu"),
                  log_every=5)
while True:
    monitor.data_wait_started()
    time.sleep(0.01)
    monitor.data_ready()
    time.sleep(0.09)
    monitor.step(8, tokens=8 * 100, loss=2.0, lr=1e-3)
    if monitor.steps % 5 == 0:
        monitor.flush()
        # What NVML's samples of its GPU would add on a GPU rank (a CPU device measures none): host-bound idle.
        monitor._metrics.time.labels("0", "host_bound").inc(0.02)
"""


def rules() -> list[dict]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


RECORDING_RULES = [rule for rule in rules() if "record" in rule]
RECORDED = {rule["record"] for rule in RECORDING_RULES}
ALERT_EXPRS = {rule["alert"]: rule["expr"] for rule in rules() if "alert" in rule}


def raw_inputs(expr: str) -> set[str]:
    """The exporter metrics an expression reads, through any recorded series it reads."""
    names = set()
    for name in metric_names(expr):
        if name in RECORDED:
            for rule in RECORDING_RULES:
                if rule["record"] == name:
                    names |= raw_inputs(rule["expr"])
        else:
            names.add(name)
    return names


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


class Processes:
    """The processes this test starts, each stopped by its own PID at the end."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.started: list[subprocess.Popen] = []
        self.names: list[str] = []

    def assert_running(self) -> None:
        """Fail at once, with its log, when a process of the stack has exited: nothing more will show up."""
        for name, process in zip(self.names, self.started, strict=True):
            if process.poll() is not None:
                log = (self.logs / f"{name}.log").read_text()[-3000:]
                pytest.fail(f"{name} exited with {process.returncode}:\n{log}")

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self.names.append(name)
        with (self.logs / f"{name}.log").open("w") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})},
            )
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        # SIGKILL to each process and its descendants: nothing here asserts on how they stop (the trainer's
        # SIGTERM, its checkpoint and exit are tested elsewhere), and a trainer stopping gracefully takes seconds.
        for process in reversed(self.started):
            kill_tree(process)


@dataclass
class Stack:
    prometheus: str
    exporters: dict[str, str]  # scrape job -> the exporter's /metrics URL
    processes: Processes
    deadline: float = field(default_factory=lambda: time.monotonic() + DEADLINE_SECONDS)
    _produced: set[str] = field(default_factory=set)

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return json.loads(http_get(url))["data"]["result"]

    def series(self, selector: str) -> list[dict]:
        url = f"{self.prometheus}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})
        return json.loads(http_get(url))["data"]

    def eventually(self, read: Callable[[], list], good: Callable[[list], bool]) -> list:
        """Read until `good` holds or the deadline passes; the last reading either way, for the assertion."""
        while True:
            self.processes.assert_running()
            result = read()
            if good(result) or time.monotonic() > self.deadline:
                return result
            time.sleep(1)

    def produced(self, wanted: set[str]) -> set[str]:
        """Every sample name the exporters have served, read again while any name `wanted` is not among them, until
        the deadline: a rank serves its info as it registers, its interval series (loss, MFU) only once it has
        recorded an interval."""

        def missing() -> list[str]:
            for text in [_text(url) for url in self.exporters.values()]:
                for family in text_string_to_metric_families(text):
                    self._produced |= {sample.name for sample in family.samples}
            return sorted(wanted - self._produced)

        if not wanted <= self._produced:
            self.eventually(missing, lambda names: not names)
        return self._produced


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def prometheus_config(folder: Path, targets: dict[str, str]) -> Path:
    """The project's prometheus.yml with 1s intervals, absolute rule paths and one scrape job per exporter."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(path) for path in RULE_FILES]
    template = config["scrape_configs"][0]
    config["scrape_configs"] = []
    for job, target in targets.items():
        targets_file = folder / f"targets-{job}.yml"
        targets_file.write_text(yaml.safe_dump([{"targets": [target]}]))
        config["scrape_configs"].append(
            {**template, "job_name": job, "file_sd_configs": [{"files": [str(targets_file)]}]}
        )
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def train_command(run_dir: Path, exporter_port: int, *extra: str) -> list[str]:
    # far more steps than the test lasts: the runs train until the test stops them with SIGTERM
    return [
        str(TRAINSTACK),
        "train",
        "--output-dir",
        str(run_dir),
        "--max-steps",
        "100000",
        "--exporter-port",
        str(exporter_port),
        "--master-port",
        str(free_port()),
        "--num-workers",
        "0",
        "--log-every",
        "2",
        "--checkpoint-every",
        "0",
        *extra,
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("prometheus-stack")
    processes = Processes(folder)
    ports = {job: free_port() for job in (INPUT_BOUND, SLOWED, FAKE_GPU)}
    fake_run = folder / "fake-gpu-run"
    (fake_run / "metrics").mkdir(parents=True)
    gpu0_uuid = json.loads(FAKE_HOST.read_text())["gpus"][0]["uuid"]
    try:
        processes.start(
            "fake-gpu-exporter",
            [
                sys.executable,
                "-m",
                "trainstack.monitoring.exporter",
                "--nvml-module",
                "trainstack.monitoring.nvml_fake",
                "--port",
                str(ports[FAKE_GPU]),
                "--metrics-dir",
                str(fake_run / "metrics"),
                "--run-dir",
                str(fake_run),
            ],
            env={"NVML_FAKE_HOST": str(FAKE_HOST)},
        )
        processes.start(
            "synthetic-rank",
            [sys.executable, "-c", SYNTHETIC_RANK, str(fake_run), gpu0_uuid],
            env={"PROMETHEUS_MULTIPROC_DIR": str(fake_run / "metrics")},
        )
        processes.start(
            "input-bound-run",
            train_command(
                folder / "input-bound",
                ports[INPUT_BOUND],
                "--batch-size",
                "8",
                "--dataset",
                "tests.factories:slow_dataset",
            ),
            env={"TRAINSTACK_TEST_SAMPLE_DELAY": "0.1"},
        )
        processes.start(
            "slowed-run",
            train_command(
                folder / "slowed",
                ports[SLOWED],
                "--batch-size",
                "4",
                "--dataset",
                "tests.factories:slow_dataset",
                "--model",
                "tests.factories:pausing_gpt",
            ),
            env={
                "TRAINSTACK_TEST_SAMPLE_DELAY": "0.1",
                "TRAINSTACK_TEST_SLOW_RANK": SLOW_RANK,
                "TRAINSTACK_TEST_SLOW_SECONDS": "0.3",
            },
        )
        prometheus_port = free_port()
        config = prometheus_config(folder, {job: f"127.0.0.1:{port}" for job, port in ports.items()})
        processes.start(
            "prometheus",
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                "--storage.tsdb.retention.time=1h",
            ],
        )
        stack = Stack(
            prometheus=f"http://127.0.0.1:{prometheus_port}",
            exporters={job: f"http://127.0.0.1:{port}/metrics" for job, port in ports.items()},
            processes=processes,
        )
        ready = stack.eventually(lambda: [_text(f"{stack.prometheus}/-/ready")], all)
        assert all(ready), f"Prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}"
        # A stall's evidence as the launcher writes it (RUN_DIR/hang), for the hang panel: after the fake run's rank
        # registered, since only the current launch's stall is served.
        stack.eventually(lambda: list((fake_run / "metrics").glob("hang-rank-*.json")), bool)
        stall = RunDir(fake_run).stall(1).path
        stall.mkdir(parents=True)
        StallDir(stall).verdict.write_text(json.dumps(FAKE_RUN_STALL))
        yield stack
    finally:
        processes.stop_all()


def _text(url: str) -> str:
    """The page, or "" while the server is not up yet."""
    try:
        return http_get(url)
    except OSError:
        return ""


def assert_reads_produced_metrics(expr: str, stack: Stack) -> None:
    read = metric_names(expr) - RECORDED - PROMETHEUS_SERIES
    missing = read - stack.produced(read)
    assert not missing, f"{expr!r} reads {sorted(missing)}, which no exporter produces"


def rule_selector(rule: dict) -> str:
    labels = ", ".join(f'{name}="{value}"' for name, value in sorted(rule.get("labels", {}).items()))
    return f"{rule['record']}{{{labels}}}"


@pytest.mark.parametrize("rule", RECORDING_RULES, ids=rule_selector)
def test_recording_rule_returns_data(stack: Stack, rule: dict) -> None:
    assert_reads_produced_metrics(rule["expr"], stack)
    result = stack.eventually(lambda: stack.query(rule_selector(rule)), finite)
    assert finite(result), f"{rule_selector(rule)} has no value: {result}"


def dashboard_targets() -> list[tuple[str, str]]:
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for path in DASHBOARD_FILES
        for panel in json.loads(path.read_text())["panels"]
        for target in panel.get("targets", [])
    ]


def dashboard_variables() -> list[tuple[str, str]]:
    return [
        (variable["name"], variable["definition"])
        for path in DASHBOARD_FILES
        for variable in json.loads(path.read_text())["templating"]["list"]
        if variable["type"] == "query"
    ]


def with_all_selected(expr: str) -> str:
    """What Grafana sends with every variable on "All" (allValue .*) and the 1s scrape interval of this test."""
    return re.sub(r"\$(job|instance|gpu|rank)\b", ".*", expr).replace("$__rate_interval", "1m")


@pytest.mark.parametrize(("panel", "expr"), dashboard_targets(), ids=[t[0] for t in dashboard_targets()])
def test_dashboard_query_returns_data(stack: Stack, panel: str, expr: str) -> None:
    assert_reads_produced_metrics(expr, stack)
    result = stack.eventually(lambda: stack.query(with_all_selected(expr)), finite)
    assert finite(result), f"{panel}: {expr!r} returns nothing: {result}"


@pytest.mark.parametrize(("name", "definition"), dashboard_variables(), ids=[v[0] for v in dashboard_variables()])
def test_dashboard_variable_has_values(stack: Stack, name: str, definition: str) -> None:
    selector, label = label_values_metric(with_all_selected(definition))
    assert_reads_produced_metrics(selector, stack)
    values = stack.eventually(lambda: [s[label] for s in stack.series(selector) if s.get(label)], bool)
    assert values, f"variable {name}: {definition} has no values"


def test_slowed_loader_shows_data_wait_above_the_input_bound_threshold(stack: Stack) -> None:
    threshold = thresholds.INPUT_BOUND.value
    ratio = f'rank:trainstack_train_data_wait:ratio_rate2m{{job="{SLOWED}"}}'
    result = stack.eventually(
        lambda: stack.query(ratio), lambda r: len(r) == 2 and all(float(s["value"][1]) > threshold for s in r)
    )
    assert sorted(s["metric"]["rank"] for s in result) == ["0", "1"], result
    assert all(float(s["value"][1]) > threshold for s in result), f"data wait not above {threshold}: {result}"
    # Prometheus evaluated the loaded alert rule: pending, waiting out its `for`
    pending = stack.eventually(
        lambda: stack.query(f'ALERTS{{alertname="TrainstackInputBound", job="{SLOWED}"}}'), lambda r: len(r) == 2
    )
    assert sorted(s["metric"]["rank"] for s in pending) == ["0", "1"], pending


def test_slowed_rank_is_named_the_straggler(stack: Stack) -> None:
    alert = f'({ALERT_EXPRS["TrainstackStragglerRank"]}) and on (job) up{{job="{SLOWED}"}}'
    result = stack.eventually(lambda: stack.query(alert), lambda r: [s["metric"]["rank"] for s in r] == [SLOW_RANK])
    assert [s["metric"]["rank"] for s in result] == [SLOW_RANK], result
    pending = stack.eventually(
        lambda: stack.query(f'ALERTS{{alertname="TrainstackStragglerRank", job="{SLOWED}"}}'), bool
    )
    assert [s["metric"]["rank"] for s in pending] == [SLOW_RANK], pending


def test_a_slowed_loader_is_input_bound_through_the_exporter_and_prometheus(stack: Stack) -> None:
    source = PrometheusSource(stack.prometheus, selector=f'job="{INPUT_BOUND}"')

    def data_wait_rates() -> list:
        # rate() needs two scrapes of each rank's counters inside its window
        try:
            return source.rate("trainstack_train_data_wait_seconds_total")
        except (ConfigError, RuntimeFailure):
            return []

    def both_input_bound(verdicts: list) -> bool:
        return (
            kinds(verdicts) == ["input-bound"] and "rank 0, rank 1 wait(s) for the data loader" in verdicts[0].summary
        )

    assert len(stack.eventually(data_wait_rates, lambda rates: len(rates) == 2)) == 2
    # Read until both say so: a run's first seconds (no step done yet; one rank's loader a batch ahead of the
    # other's, which then waits at the all-reduce instead) are no steady state, and the test may reach them first.
    from_prometheus = stack.eventually(lambda: diagnose(read_snapshot(source), LIMITS), both_input_bound)
    from_exporter = stack.eventually(lambda: diagnose_url(stack.exporters[INPUT_BOUND]), both_input_bound)
    for verdicts in (from_exporter, from_prometheus):
        assert kinds(verdicts) == ["input-bound"], verdicts
        assert "rank 0, rank 1 wait(s) for the data loader" in verdicts[0].summary
