"""One process driving several GPUs (nn.DataParallel) through processes: `trainstack diagnose` on the NVML fake's
`dataparallel` host, a real Prometheus, and the alert's promtool test fed with what the exporter serves (the
verdict from snapshots: tests/unit/monitoring/test_one_process_many_gpus.py)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import yaml

from tests.helpers.fakes import LIMITS, kinds
from tests.helpers.runs import REPO, run_trainstack
from tests.helpers.scrapes import scrape
from tests.helpers.uninstrumented import PROCESS_MEMORY, UNINSTRUMENTED, fake_exporter
from trainstack import catalog
from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring.diagnose.snapshot import read_snapshot
from trainstack.monitoring.diagnose.sources import PrometheusSource
from trainstack.monitoring.diagnose.verdicts import diagnose

ALERT = "TrainstackOneProcessManyGPUs"


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
