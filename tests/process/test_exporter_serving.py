"""The exporter as a server: HTTP endpoints, training metrics from a multiprocess directory, promtool on a live
scrape, the command line (flags, bad input, SIGTERM), and the GPU log for the run report.

Training metrics come from stand-in ranks (bench/standin_ranks.py) that write prometheus_client multiprocess
files the way trainstack/telemetry/ does; tests/process/test_exporter_live.py scrapes a real training run.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trainstack.monitoring.nvml_fake as fake
from bench.standin_ranks import write_rank
from tests.helpers.runs import REPO
from trainstack import metric_files
from trainstack.errors import EXIT_RUNTIME
from trainstack.monitoring.exporter.app import Exporter
from trainstack.monitoring.exporter.config import ExporterConfig
from trainstack.monitoring.exporter.training import TrainingCollector

pytestmark = pytest.mark.slow

TRAINING_METRICS = [
    "trainstack_train_steps_total",
    "trainstack_train_samples_total",
    "trainstack_train_tokens_total",
    "trainstack_train_step_duration_seconds_bucket",
    "trainstack_train_step_duration_seconds_count",
    "trainstack_train_data_wait_seconds_total",
    "trainstack_train_forward_seconds_total",
    "trainstack_train_loss",
    "trainstack_train_learning_rate",
    "trainstack_train_last_step_timestamp_seconds",
    "trainstack_train_epoch",
    "trainstack_train_last_checkpoint_timestamp_seconds",
    "trainstack_train_checkpoint_duration_seconds",
    "trainstack_train_rank_info",
    "trainstack_train_run_info",
]


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory) -> Path:
    """Two ranks' worth of multiprocess files, written by two processes that have exited."""
    directory = tmp_path_factory.mktemp("run") / "metrics"
    directory.mkdir()
    for rank, steps in ((0, 20), (1, 19)):
        write_rank(directory, rank, steps)
    return directory


@pytest.fixture
def fake_host():
    fake.load("mixed")
    yield
    fake.load(None)


@pytest.fixture
def running(metrics_dir, fake_host, tmp_path):
    exporter = Exporter(
        ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            metrics_dir=metrics_dir,
            run_dir=tmp_path,
            gpu_log_interval_seconds=0.05,
        )
    )
    exporter.start()
    yield exporter
    exporter.stop()


def get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(samples, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def test_metrics_endpoint_serves_gpu_training_and_exporter_metrics(running):
    status, content_type, text = get(running.server.port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples = parse(text)
    for name in TRAINING_METRICS:
        ranks = {dict(labels).get("rank") for labels in series(samples, name)}
        assert ranks == {"0", "1"}, name
    steps = {dict(labels)["rank"]: v for labels, v in series(samples, "trainstack_train_steps_total").items()}
    assert steps == {"0": 20, "1": 19}
    assert series(samples, "trainstack_train_loss") == {
        frozenset({("rank", "0")}): 2.5,
        frozenset({("rank", "1")}): 2.5,
    }  # no pid label
    assert len(series(samples, "trainstack_gpu_info")) == 4
    assert series(samples, "trainstack_exporter_nvml_up") == {frozenset(): 1}
    assert series(samples, "trainstack_exporter_collector_success") == {
        frozenset({("collector", "gpu")}): 1,
        frozenset({("collector", "training")}): 1,
        frozenset({("collector", "hang")}): 1,
        frozenset({("collector", "watched command")}): 1,
    }


def test_metrics_are_the_text_format_gzipped_when_asked(running):
    prometheus = {
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip",
    }
    request = urllib.request.Request(f"http://127.0.0.1:{running.server.port}/metrics", headers=prometheus)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert response.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(response.read()).decode()
    assert "# EOF" not in text  # not OpenMetrics
    assert len(series(parse(text), "trainstack_train_steps_total")) == 2


def test_healthz_index_and_unknown_paths(running):
    status, content_type, body = get(running.server.port, "/healthz")
    assert status == 200 and content_type == "application/json"
    health = json.loads(body)
    assert health["status"] == "ok" and health["nvml"] == "up" and health["gpus"] == 4
    assert health["metrics_dir_present"] is True
    assert get(running.server.port, "/")[0] == 200
    status, _, body = get(running.server.port, "/nothing-here")
    assert status == 404 and "/metrics" in body


def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def test_bad_requests_get_an_http_error_and_stalled_clients_hold_up_no_scrape(running):
    port = running.server.port
    idle = socket.create_connection(("127.0.0.1", port), timeout=30)  # says nothing
    half = socket.create_connection(("127.0.0.1", port), timeout=30)
    half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its request
    try:
        assert get(port, "/metrics")[0] == 200
        for path in (b"/metrics", b"/healthz"):
            post = raw_request(port, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            status, headers = post.split(b"\r\n", 1)
            assert status.split()[1] == b"405" and b"Allow: " in headers and b"GET" in headers, post
        assert b"Error code: 400" in raw_request(port, b"NOT HTTP AT ALL\r\n\r\n")  # the standard library's page
        assert get(port, "/metrics")[0] == 200
    finally:
        idle.close()
        half.close()


def test_stopping_closes_the_listening_socket(metrics_dir, fake_host):
    exporter = Exporter(ExporterConfig(port=0, nvml_module="trainstack.monitoring.nvml_fake", metrics_dir=metrics_dir))
    exporter.start()
    assert get(exporter.server.port, "/metrics")[0] == 200
    exporter.stop()
    assert not exporter.server._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", exporter.server.port), timeout=30).close()


def test_gpu_snapshots_are_logged_for_the_run_report(running):
    log = running.config.run_dir / "telemetry" / "gpu.jsonl"
    records = []
    for _ in range(600):  # until the writer has taken two snapshots, however slow the machine
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if len(records) >= 8:
            break
        time.sleep(0.05)
    assert len(records) >= 8
    assert {r["gpu"] for r in records} == {0, 1, 2, 3}
    h100 = next(r for r in records if r["gpu"] == 0)
    assert set(h100) == {
        "time",
        "gpu",
        "uuid",
        "utilization_ratio",
        "memory_used_bytes",
        "memory_total_bytes",
        "power_watts",
    }
    assert h100["utilization_ratio"] == 0.98 and h100["memory_total_bytes"] == 85520809984


def test_a_scrape_while_an_nvml_call_hangs_answers_from_the_last_sample_and_its_age_grows(metrics_dir, fake_host):
    exporter = Exporter(
        ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            metrics_dir=metrics_dir,
            sample_interval_seconds=0.05,
            slow_sample_interval_seconds=0.05,
        )
    )
    exporter.start()
    entered, release = fake.hang("nvmlDeviceGetUtilizationRates")
    try:
        assert entered.wait(60), "the sampler never called NVML again"
        # The sampler's thread is now inside the hung call, and stays there until `release` is set.
        ages = []
        for _ in range(1200):  # until the age has grown (what is asserted is the order, not how fast)
            if len(ages) >= 2 and ages[-1] > ages[0]:
                break
            samples = parse(get(exporter.server.port, "/metrics")[2])
            ages.append(series(samples, "trainstack_exporter_gpu_sample_age_seconds")[frozenset({("cadence", "fast")})])
            assert len(series(samples, "trainstack_gpu_utilization_ratio")) == 4  # the last sample, all GPUs
            assert series(samples, "trainstack_exporter_collector_success")[frozenset({("collector", "gpu")})] == 1
            time.sleep(0.05)
        assert ages[-1] > ages[0]
        assert not release.is_set() and entered.is_set()  # every scrape above answered during the hang
        assert json.loads(get(exporter.server.port, "/healthz")[2])["nvml"] == "up"
    finally:
        release.set()
        exporter.stop()
    assert ages == sorted(ages)


def test_a_file_gone_between_listing_and_reading_fails_no_scrape(metrics_dir, monkeypatch):
    """A new run clearing the directory while a scrape reads it: the collector lists the files again."""
    listings = []
    real_listing = metric_files._sized_files

    def listing_with_a_file_since_removed(folder):
        found = real_listing(folder)
        listings.append(found)
        return [*found, str(metrics_dir / "counter_999999.db")] if len(listings) == 1 else found

    monkeypatch.setattr(metric_files, "_sized_files", listing_with_a_file_since_removed)
    families = {family.name: family for family in TrainingCollector(metrics_dir).collect()}
    assert len(listings) == 2
    steps = {s.labels["rank"]: s.value for s in families["trainstack_train_steps"].samples}
    assert steps == {"0": 20, "1": 19}


def nvml_initializes() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_no_driver_still_serves_training_metrics(metrics_dir):
    """With the real pynvml on this machine: without a driver NVML is reported down and training is served."""
    exporter = Exporter(ExporterConfig(port=0, metrics_dir=metrics_dir))
    exporter.start()
    try:
        samples = parse(get(exporter.server.port, "/metrics")[2])
    finally:
        exporter.stop()
    assert len(series(samples, "trainstack_train_steps_total")) == 2
    driver = nvml_initializes()
    assert exporter.session.up == driver  # NVML is up exactly where the driver lets it start
    assert series(samples, "trainstack_exporter_nvml_up") == {frozenset(): int(driver)}
    assert any(name.startswith("trainstack_gpu_") for name, _ in samples) == driver


def test_a_new_metrics_directory_is_picked_up_without_a_restart(tmp_path, fake_host):
    metrics = tmp_path / "metrics"
    exporter = Exporter(ExporterConfig(port=0, nvml_module="trainstack.monitoring.nvml_fake", metrics_dir=metrics))
    exporter.start()
    try:
        before = parse(get(exporter.server.port, "/metrics")[2])
        metrics.mkdir()
        write_rank(metrics, rank=0, steps=3)
        after = parse(get(exporter.server.port, "/metrics")[2])
    finally:
        exporter.stop()
    assert not series(before, "trainstack_train_steps_total")
    assert series(after, "trainstack_train_steps_total") == {frozenset({("rank", "0")}): 3}


# --- the command line, in its own process -----------------------------------------------------------------------


def start_cli(*args: str, host: str | None = "mixed") -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NVML_FAKE_HOST", None)
    if host:
        env["NVML_FAKE_HOST"] = host
    process = subprocess.Popen(
        [sys.executable, "-m", "trainstack.monitoring.exporter", "--port", "0", *args],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stderr.readline()
    if "serving http://" not in line:
        process.kill()
        raise AssertionError(f"the exporter did not start: {line}{process.stderr.read()}")
    port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
    return process, port


def test_cli_serves_until_sigterm_and_exits_0(metrics_dir, tmp_path):
    process, port = start_cli(
        "--nvml-module",
        "trainstack.monitoring.nvml_fake",
        "--metrics-dir",
        str(metrics_dir),
        "--run-dir",
        str(tmp_path),
    )
    try:
        samples = parse(get(port, "/metrics")[2])
        assert len(series(samples, "trainstack_gpu_info")) == 4
        assert len(series(samples, "trainstack_train_rank_info")) == 2
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        process.stderr.close()


def test_promtool_check_metrics_on_a_live_scrape_is_clean(metrics_dir):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install Debian's prometheus package (make system-deps)")
    process, port = start_cli(
        "--nvml-module", "trainstack.monitoring.nvml_fake", "--metrics-dir", str(metrics_dir), "--pcie-throughput"
    )
    try:
        for _ in range(2):  # the second scrape also carries the collectors' own durations
            text = get(port, "/metrics")[2]
    finally:
        process.terminate()
        process.wait(timeout=60)
        process.stderr.close()
    assert "trainstack_train_steps_total" in text and "trainstack_gpu_nvlink_transmit_bytes_total" in text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port", "70000"], "--port 70000 is not a TCP port"),
        (["--metrics-dir", "pyproject.toml"], "--metrics-dir pyproject.toml is a file"),
        (["--nvml-module", "no_such_nvml_module"], "--nvml-module 'no_such_nvml_module' cannot be imported"),
        (["--sample-interval", "0"], "--sample-interval 0 is not positive"),
        (["--sample-interval", "2", "--slow-sample-interval", "1"], "--slow-sample-interval 1 is shorter than"),
        (["--sample-interval", "2", "--gpm-interval", "1"], "--gpm-interval 1 is shorter than --sample-interval 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "trainstack.monitoring.exporter", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_a_port_in_use_is_a_clear_error_and_a_runtime_failure():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trainstack.monitoring.exporter", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == EXIT_RUNTIME == 69  # not bad input: retrying once the port is free can work
    assert result.stderr.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


def test_trainstack_exporter_subcommand_is_wired(capsys):
    from trainstack.commands.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["exporter", "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in (
        "--host",
        "--port",
        "--metrics-dir",
        "--run-dir",
        "--pcie-throughput",
        "--nvml-module",
        "--sample-interval",
        "--slow-sample-interval",
    ):
        assert flag in usage
