"""The NVML fake's "watched" process entry: under a trainstack launcher it is the command the launcher runs (its pid,
its argv[0] as NVML's name), absent while there is none; outside one, the entry's own pid and name. End to end: a
single-process script under `trainstack watch` on the `dataparallel` watched_gpu is named by its own pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.nvml_fake import listed, name_of
from tests.helpers.runs import explain, run_trainstack, stop_process, trainstack_command, wait_for
from trainstack.rundir import SUPERVISOR_PID_ENV, free_port

# A stand-in launcher: it starts one command, prints its pid, ends it on "end" (printing "ended"), and exits at EOF.
LAUNCHER = textwrap.dedent("""
    import subprocess, sys
    command = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    print(command.pid, flush=True)
    for line in sys.stdin:
        command.stdin.close()
        command.wait()
        print("ended", flush=True)
""")


@pytest.mark.slow
def test_under_a_launcher_the_watched_entry_is_its_command_until_that_ends(watched_gpu, monkeypatch):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        command = int(launcher.stdout.readline())
        monkeypatch.setenv(SUPERVISOR_PID_ENV, str(launcher.pid))
        # Popen returns once the command's exec is under way, before the kernel gives it its argv: until then
        # the fake lists nothing for it, as NVML lists a process only once it has a CUDA context
        wait_for(lambda: command in listed(watched_gpu), launcher, timeout=10)
        assert listed(watched_gpu) == {command: 70_000, 777: 1_000}
        assert name_of(command) == sys.executable  # argv[0], as the launcher started it
        assert name_of(4242) is None
        launcher.stdin.write("end\n")
        launcher.stdin.flush()
        assert launcher.stdout.readline() == "ended\n"
        assert listed(watched_gpu) == {777: 1_000}
        assert name_of(command) is None
    finally:
        launcher.stdin.close()
        stop_process(launcher)


# nn.DataParallel's process, without a GPU: it names its pid, then waits to be released.
DATAPARALLEL_SCRIPT = textwrap.dedent("""
    import os, sys, time
    pid_file, release = sys.argv[1], sys.argv[2]
    with open(pid_file + ".tmp", "w") as written:
        written.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    while not os.path.exists(release):
        time.sleep(0.1)
""")


@pytest.mark.slow
def test_a_dataparallel_script_under_watch_on_the_fake_is_named_by_its_own_pid(tmp_path):
    script, pid_file, release = tmp_path / "dataparallel.py", tmp_path / "pid", tmp_path / "release"
    script.write_text(DATAPARALLEL_SCRIPT)
    port = free_port()
    watched = subprocess.Popen(
        trainstack_command(
            "watch",
            "--run-dir",
            str(tmp_path / "run"),
            "--exporter-port",
            str(port),
            "--no-report",
            "--nvml-module",
            "trainstack.monitoring.nvml_fake",
            "--",
            sys.executable,
            str(script),
            str(pid_file),
            str(release),
        ),
        env={**os.environ, "NVML_FAKE_HOST": "dataparallel"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(pid_file.exists, watched)
        pid = int(pid_file.read_text())

        def served() -> bool:  # the exporter has sampled the GPUs since the script started
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return False
            return f'pid="{pid}"' in text

        wait_for(served, watched)
        diagnosed = run_trainstack("diagnose", "--url", f"http://127.0.0.1:{port}", "--interval", "0.5", "--json")
        assert diagnosed.returncode == 1, explain(diagnosed)
        verdicts = json.loads(diagnosed.stdout)["verdicts"]
        assert [v["kind"] for v in verdicts] == ["one-process-many-gpus"]
        assert verdicts[0]["summary"].endswith(f": pid {pid} ({Path(sys.executable).name}) on 4 GPUs")
        release.touch()
        output, _ = watched.communicate(timeout=120)
    finally:
        stop_process(watched)
    assert watched.returncode == 0, output
