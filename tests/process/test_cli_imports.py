"""The commands that run beside a user's stack load no torch, and still work where torch is not installed.

Each command runs in a fresh interpreter in which torch, Accelerate and datasets cannot be imported (as on a
monitoring host that has none of them); the interpreter then reports every module it loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.helpers.runs import FAST, REPO, WITHOUT_TORCH, run_without_torch, stop_process, summary
from trainstack.rundir import free_port
from trainstack.train.launcher.cuda_devices import cuda_driver_loads


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["diagnose", "--help"], ["exporter", "--help"], ["report", "--help"]])
def test_help_loads_no_torch(args):
    outcome = run_without_torch(*args)
    assert outcome["exit"] in (0, None) and outcome["loaded"] == [], outcome


@pytest.mark.slow
@pytest.mark.skipif(cuda_driver_loads(), reason="CUDA's driver is here: the launcher asks torch for the GPUs")
def test_the_doctor_and_the_launcher_load_no_torch_on_a_cpu_host(tmp_path):
    """torch takes a launcher seconds of CPU before the first rank can start, and on a host without CUDA's
    driver it has nothing to say (no GPU), so `doctor` and `train`'s launcher leave it to the ranks; a model
    factory's module, which imports torch, the launcher reads and leaves to the ranks to run."""
    doctor = run_without_torch("doctor", "--output-dir", str(tmp_path / "checked"))
    assert doctor["exit"] in (0, 1) and doctor["loaded"] == [], doctor
    assert "2 CPU rank(s)" in doctor["stdout"], doctor["stdout"]
    model = ("--model", "tests.factories:batchnorm_lm")
    launch = run_without_torch(
        "train", "--output-dir", str(tmp_path / "run"), *FAST, *model, "--max-steps", "1", timeout=300
    )
    assert launch["exit"] == 0 and launch["loaded"] == [], launch
    assert summary(tmp_path / "run")["steps"] == 1


@pytest.mark.slow
def test_report_works_without_torch(tmp_path, cpu_run):
    run_dir = tmp_path / "run"
    shutil.copytree(cpu_run, run_dir, ignore=shutil.ignore_patterns("checkpoints", "report.html"))
    outcome = run_without_torch("report", str(run_dir))
    assert outcome["exit"] == 0 and outcome["loaded"] == [], outcome
    assert (run_dir / "report.html").stat().st_size > 0


@pytest.mark.slow
def test_exporter_and_diagnose_work_without_torch():
    port = free_port()
    env = {**os.environ, "NVML_FAKE_HOST": "dgx_h100"}
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WITHOUT_TORCH,
            "exporter",
            "--port",
            str(port),
            "--nvml-module",
            "trainstack.monitoring.nvml_fake",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    assert b"trainstack_gpu_utilization_ratio" in response.read()
                break
            except OSError:
                assert exporter.poll() is None and time.monotonic() < deadline, exporter.communicate()
                time.sleep(0.2)
        outcome = run_without_torch("diagnose", "--url", f"http://127.0.0.1:{port}/metrics", "--interval", "1")
        assert outcome["exit"] == 0 and outcome["loaded"] == [], outcome
        assert "8 GPU(s)" in outcome["stdout"], outcome["stdout"]  # the fake DGX H100's, read without torch
        # `diagnose --json | head`: a reader that goes away ends it as SIGPIPE would, with no traceback
        reader, writer = os.pipe()
        os.close(reader)
        try:
            piped = subprocess.run(
                [sys.executable, "-m", "trainstack", "diagnose", "--json", "--url", f"http://127.0.0.1:{port}/metrics"],
                stdout=writer,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(writer)
        assert (piped.returncode, piped.stderr) == (128 + 13, ""), piped.stderr  # 13: SIGPIPE
    finally:
        stop_process(exporter)
    stdout, stderr = exporter.communicate()
    assert json.loads(stdout.splitlines()[-1])["loaded"] == [], stderr
