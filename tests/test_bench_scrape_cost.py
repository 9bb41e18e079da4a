"""bench/scrape_cost.py runs end to end: the exporter process on the h100_driver580 cost profile at 1, 8 and 16
fake GPUs, 8 stand-in ranks, scheduled and back-to-back scrapes, a parsed report. Its figures are not asserted
(tests never assert timings); what is checked is that every series it is meant to scrape is there and that it
reports each figure the issue asks for, so the benchmark measures the full exporter."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, explain

pytestmark = pytest.mark.slow


def test_scrape_cost_benchmark_reports_1_8_and_16_gpus_side_by_side():
    done = subprocess.run([sys.executable, "bench/scrape_cost.py", "--scrapes", "3", "--renders", "3",
                           "--idle-seconds", "0.2", "--slow-sample-interval", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, explain(done)
    header, *per_count, targets = done.stdout.splitlines()
    assert "profile h100_driver580" in header and "8 ranks" in header
    assert len(per_count) == 9
    series = {}
    for scrape_line, render_line, sampler_line in zip(per_count[::3], per_count[1::3], per_count[2::3], strict=True):
        gpus, count = re.match(r"\s+(\d+) GPU\(s\): (\d+) series; scheduled scrapes p50 [\d.]+ ms, "
                               r"p99 [\d.]+ ms", scrape_line).groups()
        series[int(gpus)] = int(count)
        assert re.search(r"\(\d of 3 rendered ahead, not \[[\d, ]*\]\); a constant body beside them: "
                         r"p50 [\d.]+ ms, p99 [\d.]+ ms", scrape_line)
        assert re.search(r"rendered on request: p50 [\d.]+ ms, p99 [\d.]+ ms, CPU [\d.]+ ms per scrape", render_line)
        assert re.search(r"fast sample [\d.]+ ms CPU, slow sample [\d.]+ ms CPU .* = [\d.]+% of one core", sampler_line)
    # GPU, process, training and exporter series; each GPU adds its own.
    assert list(series) == [1, 8, 16] and series[1] > 250 and series[1] < series[8] < series[16]
    assert re.search(r"scrape p99 < 5 ms at every GPU count: (met|MISSED)", targets)
    assert re.search(r"sampler < 0.3% of one core at 8 GPUs: (met|MISSED) \([\d.]+%\)", targets)


def test_nvml_cost_benchmark_prints_the_driver_next_to_the_profile():
    done = subprocess.run([sys.executable, "bench/nvml_cost.py", "--calls", "3", "--sampler-seconds", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, explain(done)
    lines = done.stdout.splitlines()
    assert lines[1].startswith("  this machine: ")  # a driver's version, or why there is none
    assert lines[2] == "  profile h100_driver580 (the NVML fake): driver 580.159.04, NVIDIA H100 80GB HBM3, GPU 0 of 1"
    rows = {re.split(r"\s{2,}", line.strip())[0]: line.split()[-2:] for line in lines[4:-1]}
    for row in ("nvmlDeviceGetTotalEnergyConsumption", "per GPU: a fast sample (NvmlSession.read)",
                "per GPU: a slow sample (fast + slow part)", "the sampler's slow sample of 1 GPU(s)"):
        assert re.fullmatch(r"[\d.]+", rows[row][0]), (row, rows[row])  # the profile's CPU ms
    assert any(name.startswith("field 83 alone") for name in rows)
    assert re.search(r"8 GPUs: .*[\d.]+% \(profile\) of one core \(target < 0.3%: ", lines[-1])
