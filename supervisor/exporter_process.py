"""The launcher's exporter, supervised: its URL is announced only once it answers, and it is started again, with a
backoff, whenever it ends or never starts serving (a taken port, a crash, an OOM kill).

A restarted exporter carries on where the last one stopped: the training counters it serves are the ranks' own,
read from their multiprocess files in the metrics folder at each scrape, not kept in the exporter.

With a Prometheus target file (prometheus_sd.py), the exporter is announced there too once it first answers, and
the file is removed when the exporter is stopped: a restart in between keeps it, since the port stays the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from trainstack.lifetime import describe_end, supervised_by_me
from trainstack.rundir import METRICS_DIR_ENV, exporter_url
from trainstack.supervisor.prometheus_sd import FileSdTarget
from trainstack.write_failure import WriteFailure

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
START_TIMEOUT_SECONDS = 60.0  # imports and NVML's start on a loaded host; a healthy one answers in seconds
PROBE_SECONDS = 0.25


def probe_address(host: str) -> str:
    """Where this host reaches an exporter bound to `host`: a wildcard address is reached on loopback."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)


class SupervisedExporter:
    """`start()` returns at once; a thread starts the exporter, waits for its /healthz, announces `url` (and writes
    `discovery`, its Prometheus target file, if any), and starts it again when it ends. `stop()` removes the target
    file and ends the exporter and the thread."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        port: int,
        host: str,
        url: str,
        say: Callable[[str], None],
        discovery: FileSdTarget | None = None,
    ):
        self.command, self.env, self.url, self.say, self.discovery = command, env, url, say, discovery
        self.health_url = f"http://{probe_address(host)}:{port}/healthz"
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="exporter-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        if self.discovery:  # first: Prometheus stops looking for it rather than finding it down
            self.discovery.remove()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _supervise(self) -> None:
        backoff, served_before = FIRST_BACKOFF_SECONDS, False
        while not self._stopping.is_set():
            # In a session of its own, as the run's command: a terminal's Ctrl-C reaches the launcher alone, which
            # stops the exporter once the run has ended, rather than ending it mid-run to be started again.
            self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True)
            problem = self._wait_until_serving()
            if self._stopping.is_set():
                return
            if problem is None:
                self.say(f"metrics at {self.url}" if not served_before else f"the exporter serves {self.url} again")
                if not served_before:
                    self._announce()
                served_before, backoff = True, FIRST_BACKOFF_SECONDS
                while not self._stopping.wait(PROBE_SECONDS) and self.process.poll() is None:
                    pass
                if self._stopping.is_set():
                    return
                problem = describe_end(self.process.returncode)
            self.say(f"the exporter {problem}; starting it again in {backoff:g} s")
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _announce(self) -> None:
        """The Prometheus target file, once the port is bound. A storage that refuses it costs the discovery only."""
        if self.discovery is None:
            return
        try:
            self.discovery.write()
        except (WriteFailure, OSError) as failure:  # OSError: the folder gone since the preflight (ENOENT), ESTALE
            self.say(f"warning: Prometheus will not find this exporter: {failure}")
            return
        self.say(f"Prometheus target {self.discovery.target} in {self.discovery.path}")

    def _wait_until_serving(self) -> str | None:
        """None once /healthz answers; else why not (the process ended, or never answered and was killed)."""
        process = self.process
        assert process is not None, "asked of the process _supervise just started"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._stopping.is_set():
            if process.poll() is not None:
                return f"{describe_end(process.returncode)} before serving"
            if self._answering() == process.pid:
                return None
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                return f"did not answer on {self.health_url} within {START_TIMEOUT_SECONDS:g} s"
            self._stopping.wait(PROBE_SECONDS)
        return None

    def _answering(self) -> int | None:
        """The PID of the exporter answering /healthz, if one does."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=PROBE_SECONDS * 4) as response:
                return json.loads(response.read()).get("pid")
        except (OSError, ValueError):
            return None


def exporter_beside_run(
    metrics_dir: Path,
    run_dir: Path,
    host: str,
    port: int,
    say: Callable[[str], None],
    nvml_module: str | None = None,
    discovery: FileSdTarget | None = None,
) -> SupervisedExporter:
    """The exporter a launcher runs beside its run (`trainstack train`, `trainstack watch`): it serves the ranks'
    files in `metrics_dir`, logs GPU snapshots into `run_dir`, and stops when the launcher is gone; `discovery`, its
    Prometheus target file, is there while it runs. Not started."""
    command = [
        sys.executable,
        "-m",
        "trainstack.monitoring.exporter",
        "--host",
        host,
        "--port",
        str(port),
        "--metrics-dir",
        str(metrics_dir),
        "--run-dir",
        str(run_dir),
    ]
    if nvml_module:
        command += ["--nvml-module", nvml_module]
    env = supervised_by_me({**os.environ, METRICS_DIR_ENV: str(metrics_dir.resolve())})
    return SupervisedExporter(
        command, env=env, port=port, host=host, url=f"{exporter_url(host, port)}/metrics", say=say, discovery=discovery
    )
