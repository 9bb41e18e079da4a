"""The metric catalog (trainstack/catalog.py) against everything that names a metric.

Readers: every metric a recording rule, alert, rule unit test, dashboard query or variable, `trainstack diagnose`
or the NVML fake's stand-in ranks names is in the catalog, and each entry's `readers` are exactly the rules,
panels, variables and diagnose modules that read it. Producers: every metric in the catalog is produced, checked
on a live scrape of an exporter process on the NVML fake (the `dgx_h100` host, plus a T4 whose unsupported fields
make NVML errors) reading the files of a rank that trainer's own telemetry code wrote. Metrics that exist only
under a condition are produced by meeting the condition, never by declaring them present:
- CUDA-only gauges (peak memory) and the GPU timeline: the telemetry runs with device "cuda" on a fake CUDA
  clock and fake memory figures (torch.cuda.Event and max_memory_* stood in, as tests/test_timeline.py does);
  `test_cuda_telemetry_writes_its_gpu_only_gauges` runs the same on a real GPU;
- MFU: the telemetry is given a known peak FLOP/s, as peak_flops() gives a known GPU;
- parameter, gradient and optimizer-state bytes (per shard under FSDP): the state_measured() call the loop makes
  after the first optimizer step; compile time and recompiles: the step_compiled() call a compiling step makes;
- Xid errors, per-process memory, PCIe throughput, NVML errors: the fake host raises an Xid, lists the rank's pid
  on a GPU, the exporter runs with --pcie-throughput, and the T4 lacks fields.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from prometheus_client.multiprocess import MultiProcessCollector

from tests.helpers.promql import PROMETHEUS_SERIES, label_values_metric, metric_names
from tests.helpers.runs import REPO, stop_process
from tests.helpers.scrapes import scrape
from tests.standin_ranks import write_rank
from trainstack import catalog, ratios
from trainstack.rundir import RunDir, free_port
from trainstack.train.launcher.watch import CommandState

RULE_FILES = sorted((REPO / "monitoring/prometheus/rules").glob("*.yml"))
RULE_TEST_FILES = sorted((REPO / "monitoring/prometheus/tests").glob("*.yml"))
DASHBOARD_FILES = sorted((REPO / "monitoring/grafana/dashboards").glob("*.json"))
DIAGNOSE_DIR = REPO / "monitoring/diagnose"
# Where a metric name may not be written outside the catalog (issue 11: one module names the metrics).
PYTHON_DIRS = ("train", "monitoring", "bench", "trainstack")
CATALOG_FILE = REPO / "trainstack/catalog.py"
METRIC_NAME = re.compile(r"(?<![\w:])trainstack_(?:train|gpu|exporter|watch)_[a-z0-9_]*")
SAMPLES = {sample: metric for metric in catalog.METRICS for sample in metric.sample_names}
RECORDED = {series.name: series for series in catalog.RECORDED}
DEADLINE_SECONDS = 120  # a limit on waiting for a loaded machine, never a measured speed
# Subprocesses import from this checkout, and from whatever else PYTHONPATH names (the GPU machine's wheels).
PYTHONPATH = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))


def entry(name: str) -> catalog.Metric | catalog.Recorded:
    return SAMPLES.get(name) or RECORDED[name]


def rules() -> list[dict]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def dashboards() -> list[dict]:
    return [json.loads(path.read_text()) for path in DASHBOARD_FILES]


def queries() -> list[tuple[str, str]]:
    """(reader, PromQL) for every rule, dashboard panel query and dashboard variable."""
    found = [
        (f"record {rule['record']}" if "record" in rule else f"alert {rule['alert']}", rule["expr"]) for rule in rules()
    ]
    for dashboard in dashboards():
        for panel in dashboard["panels"]:
            found += [(f"panel {panel['title']}", target["expr"]) for target in panel.get("targets", [])]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                found.append((f"variable {variable['name']}", label_values_metric(variable["definition"])[0]))
    return found


def unknown(names: set[str]) -> set[str]:
    return {name for name in names if name not in SAMPLES and name not in RECORDED and name not in PROMETHEUS_SERIES}


def test_names_follow_the_project_conventions():
    names = [metric.name for metric in catalog.METRICS] + list(RECORDED)
    assert len(names) == len(set(names)), "a name is in the catalog twice"
    for metric in catalog.METRICS:
        assert metric.name.startswith(catalog.PREFIXES[metric.source]), metric.name
        assert metric.name.endswith("_total") == (metric.type == catalog.COUNTER), metric.name
        assert metric.name.endswith("_info") == (metric.type == catalog.INFO or metric.values == "1"), metric.name
        assert bool(metric.buckets) == (metric.type == catalog.HISTOGRAM), metric.name
        assert metric.help.endswith(".") and metric.origin, metric.name
        assert all(
            reader.split(" ", 1)[0] in {"record", "alert", "panel", "variable", "diagnose"} for reader in metric.readers
        ), metric.name
    for series in catalog.RECORDED:
        level, base, operation = series.name.split(":")
        assert level in {"rank", "job", "gpu"} and base.startswith(catalog.PREFIX) and operation, series.name


@pytest.mark.parametrize(("reader", "expr"), queries(), ids=[reader for reader, _ in queries()])
def test_rules_and_dashboards_read_only_catalog_metrics(reader: str, expr: str):
    assert not unknown(metric_names(expr)), f"{reader} reads series trainstack/catalog.py lacks"


def test_the_recording_rules_record_the_catalogs_recorded_series():
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert recorded == set(RECORDED), (
        f"recorded by the rules, not in the catalog: {sorted(recorded - set(RECORDED))}; "
        f"in the catalog, recorded by no rule: {sorted(set(RECORDED) - recorded)}"
    )


def test_rule_unit_tests_feed_only_catalog_metrics():
    for path in RULE_TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            names = {series["series"].split("{")[0] for series in case.get("input_series", [])}
            for check in case.get("promql_expr_test", []):
                names |= metric_names(check["expr"])
            assert not unknown(names), f"{path.name}: feeds or asks for series trainstack/catalog.py lacks"


def test_readers_are_what_the_rules_and_dashboards_read():
    actual: dict[str, set[str]] = {}
    for reader, expr in queries():
        for name in metric_names(expr) - PROMETHEUS_SERIES:
            actual.setdefault(entry(name).name, set()).add(reader)
    declared_kinds = ("record ", "alert ", "panel ", "variable ")
    wrong = []
    for item in [*catalog.METRICS, *catalog.RECORDED]:
        declared = {reader for reader in item.readers if reader.startswith(declared_kinds)}
        read_by = actual.get(item.name, set())
        if declared != read_by:
            wrong.append(f"{item.name}: add {sorted(read_by - declared)}, remove {sorted(declared - read_by)}")
    assert not wrong, "trainstack/catalog.py's readers differ from the rules and dashboards:\n" + "\n".join(wrong)


def catalog_references(path: Path) -> set[str]:
    """The catalog entries a module uses (`catalog.TRAIN_STEPS`...)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "catalog"
        and isinstance(getattr(catalog, node.attr, None), catalog.Metric)
    }


def ratio_references(path: Path) -> set[str]:
    """The metrics a module reads through trainstack/ratios.py's definitions (`ratios.DATA_WAIT_SHARE`...)."""
    used = [
        getattr(ratios, node.attr, None)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ratios"
    ]
    samples = {sample: metric.name for metric in catalog.METRICS for sample in metric.sample_names}
    return {
        samples[series]
        for definition in used
        if isinstance(definition, (ratios.Ratio, ratios.Throttle))
        for series in definition.series
    }


def verdict_kinds() -> set[str]:
    tree = ast.parse((DIAGNOSE_DIR / "verdicts.py").read_text())
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict"
    }


def test_diagnose_reads_what_the_catalog_says():
    read = {getattr(catalog, name).name for path in DIAGNOSE_DIR.glob("*.py") for name in catalog_references(path)}
    read |= {name for path in DIAGNOSE_DIR.glob("*.py") for name in ratio_references(path)}
    declared = {
        metric.name for metric in catalog.METRICS if any(reader.startswith("diagnose ") for reader in metric.readers)
    }
    assert read == declared, (
        f"read by monitoring/diagnose, no diagnose reader in the catalog: "
        f"{sorted(read - declared)}; declared but not read: {sorted(declared - read)}"
    )
    kinds = verdict_kinds() | {"figures"}
    assert len(kinds) > 5
    for metric in catalog.METRICS:
        named = {reader.split(" ", 1)[1] for reader in metric.readers if reader.startswith("diagnose ")}
        assert named <= kinds, f"{metric.name}: no verdict {sorted(named - kinds)} in monitoring/diagnose/verdicts.py"


@pytest.mark.slow
def test_the_metrics_docs_are_generated_from_the_catalog():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/metrics-docs.py"), "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_no_python_module_but_the_catalog_names_a_metric():
    written = []
    for directory in PYTHON_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            if path != CATALOG_FILE:
                written += [f"{path.relative_to(REPO)}: {name}" for name in METRIC_NAME.findall(path.read_text())]
    assert not written, "metric names written outside trainstack/catalog.py:\n" + "\n".join(written)


def exposed(samples) -> dict[str, set[frozenset[str]]]:
    """sample name -> the label-name sets its series carry."""
    found: dict[str, set[frozenset[str]]] = {}
    for sample in samples:
        found.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return found


def labels_wrong(found: dict[str, set[frozenset[str]]]) -> list[str]:
    wrong = []
    for name, label_sets in found.items():
        metric = SAMPLES[name]
        expected = frozenset(metric.labels) | ({"le"} if name.endswith("_bucket") else set())
        wrong += [
            f"{name}: labels {sorted(labels)}, the catalog says {sorted(expected)}"
            for labels in label_sets
            if labels != expected
        ]
    return wrong


@pytest.mark.slow
@pytest.mark.parametrize("on_gpu", [False, True])
def test_the_stand_in_ranks_write_catalog_metrics(tmp_path, on_gpu):
    write_rank(tmp_path, rank=0, steps=3, on_gpu=on_gpu)
    found = exposed(
        sample for family in MultiProcessCollector(None, str(tmp_path)).collect() for sample in family.samples
    )
    assert not unknown(set(found)), "tests/standin_ranks.py writes metrics trainstack/catalog.py lacks"
    assert not labels_wrong(found)


# One rank's telemetry as the trainer drives it, with a known peak FLOP/s, on a "cuda" device: every training metric
# a GPU rank writes. `fake-cuda` stands in CUDA's events and memory figures (a fake GPU clock, as
# tests/test_timeline.py's); `cuda` is a real GPU. The process exits, leaving its files, as a rank does.
TELEMETRY_RANK = """
import sys, time
from pathlib import Path
import torch
from trainstack.telemetry.core import Telemetry
from trainstack.telemetry.device import RankIdentity

if sys.argv[3] == "fake-cuda":
    from tests.helpers.fakes import FakeGpu
    gpu = FakeGpu()
    torch.cuda.Event = lambda enable_timing: gpu.new_event()
    torch.cuda.max_memory_allocated = lambda device: 61 << 30
    torch.cuda.max_memory_reserved = lambda device: 64 << 30
    load, compute, drain = gpu.host_works, gpu.queue, gpu.drain
else:
    load, drain = time.sleep, torch.cuda.synchronize
    def compute(seconds):
        torch.ones(1024, 1024, device="cuda").sum()
identity = RankIdentity(rank=0, local_rank=0, node="node0", uuid=sys.argv[2], run_id="catalog", world_size=1,
                        nodes=1, mixed_precision="bf16", model="builtin:tiny-gpt", dataset="builtin:sequences")
telemetry = Telemetry(Path(sys.argv[1]), identity, flops_per_token=6e6, peak=1e12, device=torch.device("cuda"))
telemetry.step_compiled(8, seconds=2.0, recompiles=1)
# A real one-process DDP model on gloo (a file store, no network): its all-reduce hook times the gradient buckets.
torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(sys.argv[1] + ".store", 1), rank=0,
                                     world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
assert telemetry.watch_communication(ddp)
for _ in range(3):
    telemetry.data_wait_started()
    load(0.01)
    telemetry.data_ready()
    telemetry.forward_started()
    compute(0.02)
    telemetry.forward_done()
    compute(0.04)
    ddp(torch.ones(2, 4)).sum().backward()
    telemetry.step_done(8)
telemetry.state_measured({"param_bytes": 1000, "grad_bytes": 1000, "optimizer_state_bytes": 2000})
drain()
telemetry.interval_done(telemetry.interval_ended(), 4, 0, 2.5, 3e-4, 3 * 8 * 64)
telemetry.checkpoint_done(0.5)
telemetry.close()
torch.distributed.destroy_process_group()
"""


def run_telemetry_rank(tmp_path: Path, metrics_dir: Path, device: str) -> None:
    metrics_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONPATH": PYTHONPATH}
    rank = subprocess.run(
        [sys.executable, "-c", TELEMETRY_RANK, str(tmp_path / "run"), "GPU-catalog", device],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rank.returncode == 0, rank.stderr[-3000:]


def fake_host(rank_pid: int) -> dict:
    """dgx_h100 with a T4 added (its missing HBM sensor and NVLink make NVML errors), the rank on GPU 0, an Xid."""
    host = json.loads((REPO / "monitoring/nvml_fake/hosts/dgx_h100.json").read_text())
    t4 = next(
        gpu
        for gpu in json.loads((REPO / "monitoring/nvml_fake/hosts/mixed.json").read_text())["gpus"]
        if gpu["model"] == "t4"
    )
    host["gpus"].append(t4)
    host["processes"] = {"0": [{"pid": rank_pid, "used_gpu_memory": 1 << 30}]}
    host["xid_events"] = [{"gpu": 1, "xid": 79, "after_seconds": 0}]
    return host


@pytest.mark.slow
def test_every_catalog_metric_is_produced_and_nothing_else(tmp_path):
    metrics_dir = tmp_path / "metrics"
    run_telemetry_rank(tmp_path, metrics_dir, "fake-cuda")
    rank_pid = int(next(metrics_dir.glob("counter_*.db")).stem.rpartition("_")[2])
    CommandState(metrics_dir, ["torchrun", "train.py"], "catalog").running(3)  # what trainstack watch writes
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps(fake_host(rank_pid)))
    stall = RunDir(tmp_path / "run").stall(1)  # what the launcher collects when no rank steps
    stall.path.mkdir(parents=True)
    stall.verdict.write_text(json.dumps({"headline": "rank 1 has not joined all_reduce #3", "culprits": [1]}))
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainstack.monitoring.exporter",
            "--nvml-module",
            "trainstack.monitoring.nvml_fake",
            "--port",
            str(port),
            "--run-dir",
            str(tmp_path / "run"),
            "--metrics-dir",
            str(metrics_dir),
            "--pcie-throughput",
        ],
        cwd=REPO,
        env={**os.environ, "NVML_FAKE_HOST": str(host_file), "PYTHONPATH": PYTHONPATH},
    )
    wanted = set(SAMPLES)
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        found = exposed(scrape(port) or [])
        while set(found) != wanted and time.monotonic() < deadline:
            time.sleep(0.5)
            found = exposed(scrape(port) or [])
    finally:
        stop_process(exporter)
    assert not unknown(set(found)), "the exporter serves metrics trainstack/catalog.py lacks"
    assert not wanted - set(found), (
        "in trainstack/catalog.py, produced by nothing (or not under the conditions "
        f"this test sets up): {sorted(wanted - set(found))}"
    )
    assert not labels_wrong(found)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_telemetry_writes_its_gpu_only_gauges(tmp_path):
    """The real CUDA path of the stand-ins above: peak memory from torch.cuda, times from CUDA events."""
    run_telemetry_rank(tmp_path, tmp_path / "metrics", "cuda")
    values = {
        sample.name: sample.value
        for family in MultiProcessCollector(None, str(tmp_path / "metrics")).collect()
        for sample in family.samples
    }
    assert values[catalog.TRAIN_MEMORY_ALLOCATED_PEAK.name] > 0
    assert values[catalog.TRAIN_MEMORY_RESERVED_PEAK.name] >= values[catalog.TRAIN_MEMORY_ALLOCATED_PEAK.name]
    assert values[catalog.TRAIN_MFU.name] > 0
    training = {sample for sample, metric in SAMPLES.items() if metric.source == catalog.TELEMETRY}
    assert set(values) == training
