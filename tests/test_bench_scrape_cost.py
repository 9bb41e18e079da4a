"""bench/scrape_cost.py runs end to end: the exporter process, 8 fake GPUs, 8 stand-in ranks, a parsed report.
Its figures are not asserted (tests never assert timings); what is checked is that every series it is meant to
scrape is there, so the benchmark measures the full exporter."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO, explain


def test_scrape_cost_benchmark_scrapes_8_gpus_and_8_ranks():
    done = subprocess.run([sys.executable, "bench/scrape_cost.py", "--scrapes", "3", "--idle-seconds", "0.2",
                           "--delay-us", "10"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, explain(done)
    header, latency, collectors, cpu = done.stdout.splitlines()
    assert "8 fake GPUs" in header and "8 ranks" in header
    assert int(re.search(r"(\d+) series", header).group(1)) > 500  # GPU, process, training and exporter series
    assert re.search(r"p50 [\d.]+ ms, p99 [\d.]+ ms", latency)
    assert re.search(r"gpu [\d.]+ ms, training [\d.]+ ms", collectors)
    assert re.search(r"CPU [\d.]+ ms per scrape", cpu)
