"""The run report of real runs: a CPU training run and GPU snapshots from the real exporter over the fake NVML,
every figure embedded and decodable, not blank in headless Chromium, and the command (the report from given
records: tests/unit/monitoring/test_report.py)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.report import embedded_figures
from tests.helpers.runs import run_trainstack
from trainstack.errors import ConfigError
from trainstack.monitoring.report import cli as report_cli
from trainstack.monitoring.report import render_report
from trainstack.monitoring.report.figures import FIGURES

GPU_FIGURES = {"gpu-utilization", "gpu-memory"}


@pytest.fixture
def gpu_run(cpu_run, tmp_path) -> Path:
    """The shared CPU run (a copy: it is read-only) plus the GPU snapshots the real exporter writes to
    telemetry/gpu.jsonl for a DGX H100 (fake NVML)."""
    from trainstack.monitoring import nvml_fake
    from trainstack.monitoring.exporter.app import Exporter
    from trainstack.monitoring.exporter.config import ExporterConfig

    run_dir = tmp_path / "run"
    shutil.copytree(cpu_run, run_dir)
    nvml_fake.load("dgx_h100")
    exporter = Exporter(
        ExporterConfig(
            port=0, run_dir=run_dir, nvml_module="trainstack.monitoring.nvml_fake", gpu_log_interval_seconds=0.05
        )
    )
    exporter.start()
    try:
        log, deadline = run_dir / "telemetry" / "gpu.jsonl", time.monotonic() + 60
        while not (log.is_file() and len(log.read_text().splitlines()) >= 8 * 3):
            assert time.monotonic() < deadline, "the exporter wrote no GPU snapshots"
            time.sleep(0.05)
    finally:
        exporter.stop()
        nvml_fake.load(None)
    return run_dir


@pytest.mark.slow
def test_report_of_a_gpu_run_embeds_every_figure(gpu_run):
    report = render_report(gpu_run)
    assert report == gpu_run / "report.html"
    figures = embedded_figures(report)
    assert set(figures) == {spec.id for spec in FIGURES}
    for image in figures.values():
        assert image.format == "PNG" and image.width >= 800 and image.height >= 300
    text = report.read_text()
    # Self-contained: nothing to fetch, nothing to run.
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", text) and "<script" not in text
    summary = json.loads((gpu_run / "summary.json").read_text())
    assert summary["run_id"] in text and "<td>rank</td>" not in text
    assert "<th>median step (ms)</th>" in text


@pytest.mark.slow
def test_report_of_a_cpu_run_leaves_gpu_figures_out(cpu_run, tmp_path):
    shutil.copytree(cpu_run, tmp_path / "run")
    figures = embedded_figures(render_report(tmp_path / "run"))
    assert set(figures) == {spec.id for spec in FIGURES} - GPU_FIGURES
    assert "No GPU snapshots" in (tmp_path / "run" / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (make system-deps)")
def test_report_is_not_blank_in_a_browser(gpu_run, tmp_path):
    report = render_report(gpu_run)
    screenshot = tmp_path / "report.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={screenshot}",
            "--window-size=1200,4000",
            report.resolve().as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    image = Image.open(screenshot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 500  # text, tables and anti-aliased plot lines; a blank or error page has a handful
    present = {colour for _count, colour in colours}
    # matplotlib's first two line colours prove the embedded PNGs were decoded and drawn, not just the tables.
    assert (31, 119, 180) in present and (255, 127, 14) in present


@pytest.mark.slow
def test_a_cut_off_last_line_and_unsupported_gpu_fields_are_tolerated(gpu_run):
    with (gpu_run / "telemetry" / "rank-1.jsonl").open("a") as records:
        records.write('{"time": 1, "rank": 1, "st')
    snapshot = json.loads((gpu_run / "telemetry" / "gpu.jsonl").read_text().splitlines()[-1])
    with (gpu_run / "telemetry" / "gpu.jsonl").open("a") as snapshots:
        snapshots.write(
            json.dumps({**snapshot, "time": snapshot["time"] + 1, "power_watts": None, "utilization_ratio": None})
            + "\n"
        )
    assert set(embedded_figures(render_report(gpu_run))) == {spec.id for spec in FIGURES}


@pytest.mark.slow
def test_cli_writes_the_report_and_refuses_a_non_run(cpu_run, tmp_path):
    shutil.copytree(cpu_run, tmp_path / "run")
    done = run_trainstack("report", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "run" / "report.html"
    refused = run_trainstack("report", str(tmp_path / "run" / "telemetry"))
    assert refused.returncode == 2
    assert refused.stderr.startswith("trainstack report: error: ") and len(refused.stderr.splitlines()) == 1
    with pytest.raises(ConfigError, match="is not a directory"):
        report_cli.run(argparse.Namespace(run_dir=str(tmp_path / "absent")))
