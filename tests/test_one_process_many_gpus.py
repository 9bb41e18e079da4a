"""One process driving several GPUs (nn.DataParallel), judged from the exporter's process-to-GPU map alone: the
verdict from snapshots and its look-alikes, the NVML fake's `dataparallel` host through the real exporter (read
directly, through `trainstack diagnose`, and through a real Prometheus), the one-line hint for a job that reports
no rank telemetry, and the alert's promtool test fed with what the exporter serves for the fake hosts."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.helpers.fakes import LIMITS, NOW, gpu, kinds, rank
from tests.helpers.runs import REPO, run_trainstack
from tests.helpers.scrapes import scrape
from trainstack import catalog
from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring import nvml_fake
from trainstack.monitoring.diagnose.render import render_json
from trainstack.monitoring.diagnose.snapshot import GpuProcess, GpuView, Snapshot, read_snapshot
from trainstack.monitoring.diagnose.sources import ExporterSource, PrometheusSource
from trainstack.monitoring.diagnose.verdicts import diagnose, figures, notes, uninstrumented
from trainstack.monitoring.exporter.app import Exporter
from trainstack.monitoring.exporter.config import ExporterConfig

GIB = 2**30
PROCESS_MEMORY = catalog.GPU_PROCESS_MEMORY_USED.name
ALERT = "TrainstackOneProcessManyGPUs"
# The note on a job that uses GPUs without rank telemetry and is not a watched run (tests/test_watch.py has those).
UNINSTRUMENTED = uninstrumented(Snapshot("note", 0.0, [], [GpuView("0", "GPU-0")]))


def process(pid: str, index: int, gib: float, name: str = "python", instance: str = "") -> GpuProcess:
    return GpuProcess(instance, pid, name, f"GPU-{index}", gib * GIB)


def dataparallel_gpus(*utilizations: float) -> list:
    return [gpu(index, utilization=share) for index, share in enumerate(utilizations or (0.9, 0.25, 0.35, 0.3))]


# pid 4242 on 4 GPUs, GPU 0 the busiest and the fullest: the fake `dataparallel` host's figures.
DATAPARALLEL = [process("4242", index, gib) for index, gib in enumerate((64.0, 22.0, 22.5, 22.4))]


# --- the verdict from snapshots --------------------------------------------------------------------------------


def test_dataparallel_is_named_with_each_gpu_against_the_first():
    verdicts = diagnose(Snapshot("test", NOW, [], dataparallel_gpus(), processes=DATAPARALLEL), LIMITS)
    assert kinds(verdicts) == ["one-process-many-gpus"]
    verdict = verdicts[0]
    assert verdict.summary == (
        "one process drives several GPUs (nn.DataParallel, or a model split by hand): pid 4242 (python) on 4 GPUs"
    )
    assert verdict.evidence == (
        "pid 4242 (python) is the main user of GPUs 0, 1, 2, 3",
        "GPU 0: 64.0 GiB used by it, utilization 90% (its first GPU)",
        "GPU 1: 22.0 GiB used by it (0.34x GPU 0's), utilization 25% (0.28x GPU 0's)",
        "GPU 2: 22.5 GiB used by it (0.35x GPU 0's), utilization 35% (0.39x GPU 0's)",
        "GPU 3: 22.4 GiB used by it (0.35x GPU 0's), utilization 30% (0.33x GPU 0's)",
        "GPU 0 is the busiest and the fullest: nn.DataParallel's shape (it scatters each batch, gathers the "
        "outputs and computes the loss there)",
    )
    assert "DistributedDataParallel" in verdict.fix and "torchrun --nproc-per-node" in verdict.fix


def test_it_is_named_beside_rank_telemetry_too():
    # An instrumented DataParallel loop: one rank, on GPU 0; GPUs 1-3 are busy, so no GPU is unused.
    snapshot = Snapshot("test", NOW, [rank("0", uuid="GPU-0")], dataparallel_gpus(), processes=DATAPARALLEL)
    assert kinds(diagnose(snapshot, LIMITS)) == ["one-process-many-gpus"]
    assert notes(snapshot, LIMITS) == []


def test_a_model_split_by_hand_is_named_without_the_dataparallel_shape():
    halves = [
        process("77", 0, 30.0, name="", instance="node5:9450"),
        process("77", 1, 30.0, name="", instance="node5:9450"),
    ]
    verdicts = diagnose(Snapshot("test", NOW, [], dataparallel_gpus(0.5, 0.5), processes=halves), LIMITS)
    assert kinds(verdicts) == ["one-process-many-gpus"]
    assert verdicts[0].summary.endswith(": pid 77 on node5:9450 on 2 GPUs")
    assert not any("DataParallel's shape" in line for line in verdicts[0].evidence)


@pytest.mark.parametrize(
    ("utilizations", "processes"),
    [
        # DDP: one process per GPU, and ranks 1-3 each left a CUDA context on GPU 0, where rank 0 is the main user
        (
            (0.97, 0.96, 0.97, 0.95),
            [process(f"510{i}", i, 60.0) for i in range(4)] + [process(f"510{i}", 0, 0.5) for i in range(1, 4)],
        ),
        # a notebook that loaded a model onto two GPUs and computes nothing
        ((0.0, 0.0), [process("88", 0, 8.0), process("88", 1, 8.0)]),
        # the same pid on two hosts is two processes
        ((0.9, 0.9), [process("31", 0, 40.0, instance="node3:9450"), process("31", 1, 40.0, instance="node4:9450")]),
        # a GPU without a utilization figure does not count as busy
        ((0.9, None), [process("4242", 0, 60.0), process("4242", 1, 20.0)]),
    ],
    ids=["ddp-with-stray-contexts", "idle-notebook", "two-hosts", "utilization-unknown"],
)
def test_look_alikes_are_not_named(utilizations, processes):
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(*utilizations), processes=processes)
    assert "one-process-many-gpus" not in kinds(diagnose(snapshot, LIMITS))


def test_without_rank_telemetry_the_gpu_verdicts_stand_and_a_note_says_what_is_missing():
    processes = [process(f"510{i}", i, 60.0) for i in range(3)]  # GPU 3: no process, idle
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.97, 0.96, 0.95, 0.0), processes=processes)
    verdicts = diagnose(snapshot, LIMITS)
    assert kinds(verdicts) == ["gpus-unused"]
    assert verdicts[0].summary == "processes use 3 GPU(s) while 1 of 4 visible GPU(s) sit idle with no process on them"
    assert verdicts[0].evidence == ("GPU 3 (NVIDIA H100 80GB HBM3): utilization 0%, no process on it",)
    assert notes(snapshot, LIMITS) == [UNINSTRUMENTED]
    assert "\n" not in UNINSTRUMENTED and "trainstack.integrations.hf.TrainstackCallback" in UNINSTRUMENTED
    shown = json.loads(render_json("test", verdicts, figures(snapshot), notes(snapshot, LIMITS)))
    assert shown["notes"] == [UNINSTRUMENTED] and not shown["healthy"]


def test_nothing_on_the_gpus_and_no_ranks_is_still_no_training():
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.0, 0.01))
    assert kinds(diagnose(snapshot, LIMITS)) == ["no-training"] and notes(snapshot, LIMITS) == []


def test_a_busy_gpu_without_ranks_is_an_uninstrumented_job_even_where_its_processes_are_hidden():
    # An exporter outside the job's PID namespace may list no process; the busy GPU still says a job runs.
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.9, 0.0))
    assert diagnose(snapshot, LIMITS) == [] and notes(snapshot, LIMITS) == [UNINSTRUMENTED]


# --- the fake hosts through the real exporter ------------------------------------------------------------------


@contextlib.contextmanager
def fake_exporter(host: str) -> Iterator[str]:
    """The exporter, in this process, on a host of the NVML fake and no metrics directory (no rank telemetry, as for
    an uninstrumented job); yields its /metrics URL."""
    nvml_fake.load(host)
    exporter = Exporter(
        ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            sample_interval_seconds=0.1,
            slow_sample_interval_seconds=0.2,
        )
    )
    exporter.start()
    try:
        yield f"http://127.0.0.1:{exporter.server.port}/metrics"
    finally:
        exporter.stop()
        nvml_fake.load(None)


def test_the_exporter_serves_the_process_to_gpu_map_of_the_dataparallel_host():
    with fake_exporter("dataparallel") as url:
        served = {
            (s.labels["gpu"], s.labels["pid"], s.labels["process"]): s.value
            for s in scrape(url)
            if s.name == PROCESS_MEMORY
        }
    assert served == {
        ("0", "4242", "python"): 70.5e9,
        ("1", "4242", "python"): 24.1e9,
        ("2", "4242", "python"): 24.3e9,
        ("3", "4242", "python"): 24.2e9,
    }


@pytest.mark.parametrize(("host", "expected"), [("dataparallel", ["one-process-many-gpus"]), ("ddp_h100", [])])
def test_diagnose_judges_the_fake_hosts_from_the_exporter_alone(host, expected):
    with fake_exporter(host) as url:
        snapshot = read_snapshot(ExporterSource(url, interval=0.3))
    assert snapshot.ranks == [] and len(snapshot.processes) == 4
    verdicts = diagnose(snapshot, LIMITS)
    assert kinds(verdicts) == expected
    assert notes(snapshot, LIMITS) == [UNINSTRUMENTED]
    if expected:
        assert verdicts[0].evidence[1] == "GPU 0: 65.7 GiB used by it, utilization 90% (its first GPU)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("host", "code", "first"),
    [
        ("dataparallel", 1, "ONE-PROCESS-MANY-GPUS  one process drives several GPUs"),
        # No rank reports: nothing of them was judged, so never HEALTHY; the GPUs' figures still follow.
        ("ddp_h100", 0, "NOT JUDGED  the GPUs are in use, but no rank reports telemetry"),
    ],
)
def test_the_diagnose_command_gives_the_gpu_verdicts_and_its_one_line_hint(host, code, first):
    with fake_exporter(host) as url:
        result = run_trainstack("diagnose", "--url", url, "--interval", "0.5")
    lines = result.stdout.splitlines()
    assert result.returncode == code, result.stdout + result.stderr
    assert lines[1].startswith(first) and "no-training" not in result.stdout.lower()
    assert "figures: 0 rank(s), 4 GPU(s)" in result.stdout and "HEALTHY" not in result.stdout
    if host == "ddp_h100":
        assert lines[2].startswith("figures: 0 rank(s), 4 GPU(s), GPU utilization 98% on average")
    assert lines[-1] == UNINSTRUMENTED


@pytest.mark.slow
def test_diagnose_names_the_process_through_a_real_prometheus(prometheus):
    with fake_exporter("dataparallel") as url:
        target = url.removeprefix("http://").removesuffix("/metrics")
        source = PrometheusSource(prometheus(target))

        def scraped() -> bool:
            try:
                return (
                    len(source.instant(PROCESS_MEMORY)) == 4 and len(source.instant(catalog.GPU_UTILIZATION.name)) == 4
                )
            except (ConfigError, RuntimeFailure):  # Prometheus is still starting
                return False

        deadline = time.monotonic() + 120
        while not scraped():
            assert time.monotonic() < deadline, "Prometheus has not scraped the exporter after 120 s"
            time.sleep(1)
        verdicts = diagnose(read_snapshot(source), LIMITS)
    assert kinds(verdicts) == ["one-process-many-gpus"]
    assert verdicts[0].evidence[0] == f"pid 4242 (python) on {target} is the main user of GPUs 0, 1, 2, 3"


# --- the alert, fed with what the exporter serves ---------------------------------------------------------------


def input_series(url: str, job: str, instance: str) -> list[dict]:
    """Every GPU series the exporter serves now, as promtool input held constant for 20 minutes."""
    series = []
    for sample in scrape(url):
        if sample.name.startswith(catalog.GPU_PREFIX):
            labels = {**sample.labels, "job": job, "instance": instance}
            written = ",".join(f'{name}="{value}"' for name, value in sorted(labels.items()))
            series.append({"series": f"{sample.name}{{{written}}}", "values": f"{sample.value:g}x80"})
    return series


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found: install Debian's `prometheus` package (make system-deps)",
)
def test_the_alert_fires_on_what_the_exporter_serves_for_the_dataparallel_host_only(tmp_path):
    served = []
    for host, job, instance in (("dataparallel", "dataparallel", "node0:9450"), ("ddp_h100", "ddp", "node1:9450")):
        with fake_exporter(host) as url:
            served += input_series(url, job, instance)
    rules = yaml.safe_load((REPO / "monitoring/prometheus/rules/alerts.yml").read_text())
    alert = next(rule for group in rules["groups"] for rule in group["rules"] if rule.get("alert") == ALERT)
    tests = {
        "rule_files": [
            str(REPO / "monitoring/prometheus/rules/recording.yml"),
            str(REPO / "monitoring/prometheus/rules/alerts.yml"),
        ],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": served,
                "alert_rule_test": [
                    {"eval_time": "8m", "alertname": ALERT, "exp_alerts": []},
                    {
                        "eval_time": "12m",
                        "alertname": ALERT,
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "job": "dataparallel",
                                    "instance": "node0:9450",
                                    "pid": "4242",
                                    "process": "python",
                                },
                                "exp_annotations": {
                                    **alert["annotations"],
                                    "summary": "Process 4242 (python) on node0:9450 drives 4 GPUs by itself",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "one-process.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
