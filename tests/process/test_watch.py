"""`trainstack watch -- COMMAND`: any command run as a trainstack run. Its exit code and signals pass through, bad
input is one line that changes nothing, the lease keeps a second watch out, and an uninstrumented command still
gets the GPU series (on the NVML fake) and a report of them."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.helpers.runs import (
    explain,
    kill_tree,
    run_trainstack,
    run_without_torch,
    start_watch,
    stop_process,
    torchrun,
    wait_for,
)
from trainstack import catalog
from trainstack.rundir import (
    LAUNCHED_AT_ENV,
    LEASE_DIR,
    METRICS_DIR_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    SUPERVISOR_PID_ENV,
    WATCH_HINT_SECONDS_ENV,
    WATCHED_COMMAND_FILE,
    RunDir,
    free_port,
)

NO_EXPORTER = ("--exporter-port", "0")


def watch(run_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_trainstack("watch", "--run-dir", str(run_dir), *args, timeout=120, cwd=run_dir.parent, **kwargs)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


# ---- for real ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_the_commands_exit_code_comes_through_and_it_gets_the_run_environment(tmp_path, code):
    run_dir = tmp_path / "run"
    seen = tmp_path / "env.json"
    names = [METRICS_DIR_ENV, RUN_DIR_ENV, RUN_ID_ENV, LAUNCHED_AT_ENV, SUPERVISOR_PID_ENV]
    result = watch(
        run_dir,
        *NO_EXPORTER,
        "--",
        *python(f"""
        import json, os
        open({str(seen)!r}, "w").write(json.dumps({{name: os.environ.get(name) for name in {names!r}}}))
        raise SystemExit({code})
    """),
        env={SUPERVISOR_PID_ENV: "1"},
    )
    assert result.returncode == code, explain(result)
    env = json.loads(seen.read_text())
    assert env[METRICS_DIR_ENV] == str(run_dir.resolve() / "metrics" / "node-0")
    assert env[RUN_DIR_ENV] == str(run_dir.resolve())
    assert f"trainstack watch: run {env[RUN_ID_ENV]} in {run_dir}: " in result.stderr
    assert 0 < time.time() - float(env[LAUNCHED_AT_ENV]) < 120
    assert env[SUPERVISOR_PID_ENV] is None  # names watch's parent, not the command's
    assert f"trainstack watch: the command exited with code {code}" in result.stderr
    assert not (run_dir / LEASE_DIR).exists()  # given back


@pytest.mark.slow
def test_a_command_killed_by_a_signal_exits_128_plus_its_number(tmp_path):
    result = watch(
        tmp_path / "run",
        *NO_EXPORTER,
        "--",
        *python("""
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """),
    )
    assert result.returncode == 128 + signal.SIGKILL, explain(result)
    assert "trainstack watch: the command was killed by SIGKILL" in result.stderr


@pytest.mark.slow
def test_bad_input_is_one_line_and_touches_nothing(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "telemetry").mkdir(parents=True)
    (run_dir / "telemetry" / "rank-0.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    before = tree(run_dir)
    for args, line in [
        (("--",), "no command to watch: put it after --"),
        (("--", "no-such-trainer", "--lr", "1"), "command not found: no-such-trainer is not on PATH"),
        (("--exporter-port", "70000", "--", "true"), "--exporter-port 70000 is not a TCP port"),
        (("--exporter-host", "127.0.0.256", "--", "true"), "--exporter-host 127.0.0.256 is not an address of this"),
        (("--nvml-module", "no_such_nvml", "--", "true"), "--nvml-module no_such_nvml cannot be found"),
        (("--log-every", "0", "--", "true"), "--log-every must be at least 1 step, got 0"),
    ]:
        result = watch(run_dir, *args)
        assert result.returncode == 2, explain(result)
        assert result.stderr.startswith(f"trainstack watch: error: {line}"), explain(result)
        assert len(result.stderr.splitlines()) == 1, explain(result)
        assert tree(run_dir) == before
    # A trainstack train run's folder, checkpoints and all: not the place for a watched command's record
    sealed = run_dir / "checkpoints" / "step-00000005"
    sealed.mkdir(parents=True)
    (sealed / "trainstack.json").write_text("{}")
    before = tree(run_dir)
    result = watch(run_dir, "--", "true")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, explain(result)
    assert "holds a trainstack train run's checkpoints" in result.stderr and tree(run_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("signum, group", [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True)])
def test_a_signal_to_watch_reaches_the_command_and_its_exit_code_comes_through(tmp_path, signum, group):
    """SIGTERM and SIGHUP go to the command, as `docker stop` or `kill` would send them; SIGINT to its whole
    process group, as a terminal's Ctrl-C would. Ctrl-C reaches watch's own process group too: its exporter,
    in a session of its own, serves on until the run has ended, and is not started again."""
    run_dir = tmp_path / "run"
    script = tmp_path / "trapping.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        FOLDER = {str(tmp_path)!r}
        role = sys.argv[1]

        def note(signum, frame):
            open(os.path.join(FOLDER, role), "w").write(signal.Signals(signum).name)
            if role == "command":
                child.wait(timeout=10)
                raise SystemExit(7)
            raise SystemExit(0)

        for trapped in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(trapped, note)
        if role == "command":
            child = subprocess.Popen([sys.executable, __file__, "child"])  # in the command's process group
        else:
            open(os.path.join(FOLDER, "child-ready"), "w").close()
            time.sleep(3)  # long enough for a signal sent to the group, short enough to end when none comes
            raise SystemExit(0)
        while True:
            time.sleep(0.1)
    """)
    )
    exporter = ("--exporter-port", str(free_port())) if group else NO_EXPORTER
    watched = start_watch(run_dir, *exporter, "--", sys.executable, str(script), "command")
    try:
        wait_for(lambda: (tmp_path / "child-ready").exists(), watched)
        if group:  # a terminal's Ctrl-C: to watch's process group, the exporter's too were it there
            os.killpg(watched.pid, signum)
        else:
            watched.send_signal(signum)
        output, _ = watched.communicate(timeout=60)
    finally:
        kill_tree(watched)
    assert watched.returncode == 7, output
    assert "starting it again" not in output and "exporter exited" not in output, output
    assert (tmp_path / "command").read_text() == signum.name
    assert (tmp_path / "child").exists() == group, output
    if group:
        assert (tmp_path / "child").read_text() == signum.name
    assert "trainstack watch: the command exited with code 7" in output
    # How it ended heads the card: not a run that completed.
    assert "trainstack watch: STOPPED  the command was stopped by a signal before its last step (exit code 7)" in output


@pytest.mark.slow
def test_what_the_command_leaves_running_is_stopped_before_the_run_directory_is_let_go(tmp_path):
    run_dir = tmp_path / "run"
    pid_file = tmp_path / "left.pid"
    result = watch(
        run_dir,
        *NO_EXPORTER,
        "--",
        *python(f"""
        import subprocess, sys, time
        # In a session of its own, as torchrun starts its workers: it leaves the command's process group.
        left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pid_file)!r}, "w").write(str(left.pid))
        time.sleep(1.5)  # watch looks for the command's processes once a second
    """),
    )

    def left() -> psutil.Process | None:
        """The process the command left, while it runs."""
        try:
            process = psutil.Process(int(pid_file.read_text()))
            return (
                process if process.status() != psutil.STATUS_ZOMBIE and "sleep(600)" in process.cmdline()[-1] else None
            )
        except psutil.NoSuchProcess:
            return None

    try:
        assert result.returncode == 0, explain(result)
        assert (
            "trainstack watch: 1 process(es) the command started still run 5 s after it ended; SIGTERM to them"
            in result.stderr
        )
        assert left() is None
        # A command that ends at once, before watch's first look: what it left in its session is found too.
        quick = watch(
            run_dir,
            *NO_EXPORTER,
            "--",
            *python(f"""
            import subprocess, sys
            left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(pid_file)!r}, "w").write(str(left.pid))
        """),
        )
        assert quick.returncode == 0, explain(quick)
        assert (
            "trainstack watch: 1 process(es) the command started still run 5 s after it ended; SIGTERM to them"
            in quick.stderr
        )
        assert left() is None
        # One that ends by itself soon after the command, as Lightning's rank 1 after its rank 0 (the command):
        # it finishes its work, unsignalled.
        finished = tmp_path / "finished"
        closing = watch(
            run_dir,
            *NO_EXPORTER,
            "--",
            *python(f"""
            import subprocess, sys
            code = "import time; time.sleep(2); open({str(finished)!r}, 'w').write('done')"
            subprocess.Popen([sys.executable, "-c", code])
        """),
        )
        assert closing.returncode == 0, explain(closing)
        assert finished.read_text() == "done" and "still run" not in closing.stderr, explain(closing)
    finally:
        if process := left():
            process.kill()


@pytest.mark.slow
def test_the_lease_refuses_a_second_watch_on_the_same_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    first = start_watch(run_dir, *NO_EXPORTER, "--", *python("import time; time.sleep(600)"))
    try:
        # The first watch holds the lease and its command runs: it has written all it writes before the command ends
        wait_for(lambda: (RunDir(run_dir).node_metrics(0) / WATCHED_COMMAND_FILE).exists(), first)
        holder = json.loads((run_dir / LEASE_DIR / "node-0.json").read_text())
        before = tree(run_dir)
        second = watch(run_dir, *NO_EXPORTER, "--", *python("print('ran')"))
        assert second.returncode == 2, explain(second)
        assert second.stderr.splitlines() == [second.stderr.strip()], explain(second)
        assert "is in use by another trainstack launcher: host" in second.stderr
        assert f"PID {holder['pid']} (run {holder['run_id']}, node 0)" in second.stderr
        assert second.stderr.strip().endswith("or choose another --run-dir")
        assert "ran" not in second.stdout
        assert tree(run_dir) == before
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=60)
    finally:
        kill_tree(first)
    assert first.returncode == 128 + signal.SIGTERM, output  # the sleeping command died of the forwarded signal


@pytest.mark.slow
def test_an_uninstrumented_command_gets_the_gpu_series_and_a_report_of_them(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "telemetry").mkdir(parents=True)
    (run_dir / "telemetry" / "rank-0.jsonl").write_text('{"time": 1.0, "step": 1}\n')  # an earlier run's
    port = free_port()
    release = tmp_path / "release"
    watched = start_watch(
        run_dir,
        "--exporter-port",
        str(port),
        "--nvml-module",
        "trainstack.monitoring.nvml_fake",
        "--",
        *python(f"""
        import os, time
        while not os.path.exists({str(release)!r}):
            time.sleep(0.1)
    """),
        env={"NVML_FAKE_HOST": "dgx_h100"},
    )
    try:

        def served() -> str | None:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return None

        wait_for(lambda: served() is not None, watched)
        text = served()
        for gpu in range(8):  # dgx_h100: 8 GPUs
            assert f'trainstack_gpu_utilization_ratio{{gpu="{gpu}",' in text
        assert "trainstack_train_steps_total" not in text  # no rank, no training series
        diagnosed = run_trainstack("diagnose", "--url", f"http://127.0.0.1:{port}", "--interval", "0.5", "--json")
        assert diagnosed.returncode in (0, 1), explain(diagnosed)  # a verdict, not "cannot read the source"
        diagnosis = json.loads(diagnosed.stdout)
        assert diagnosis["figures"]["gpus"] == 8
        (note,) = diagnosis["notes"]  # the one line on what per-rank verdicts need
        assert note.startswith(
            "uninstrumented: 1 process(es) of the watched command are running with no rank "
            "telemetry (GPU checks only); for per-rank verdicts"
        ), note
        release.touch()
        output, _ = watched.communicate(timeout=120)
    finally:
        stop_process(watched)
    assert watched.returncode == 0, output
    kept = next((run_dir / "previous").glob("before-*/telemetry/rank-0.jsonl"))  # set aside, not mixed in
    assert kept.read_text() == '{"time": 1.0, "step": 1}\n'
    assert not (run_dir / "telemetry" / "rank-0.jsonl").exists()
    snapshots = [json.loads(line) for line in (run_dir / "telemetry" / "gpu.jsonl").read_text().splitlines()]
    assert {s["gpu"] for s in snapshots} == set(range(8))
    page = (run_dir / "report.html").read_text()
    assert f"trainstack watch: report: {run_dir}/report.html" in output
    assert "<figure id='gpu-utilization'>" in page and "<figure id='gpu-memory'>" in page
    assert "<figure id='loss'>" not in page and "No rank records" in page


@pytest.mark.slow
def test_an_uninstrumented_ddp_job_on_a_host_without_gpus_is_called_uninstrumented_not_no_training(tmp_path):
    """2 CPU ranks under torchrun with no trainstack.monitor in their loop, and no GPU for the exporter to see."""
    run_dir, port, release = tmp_path / "run", free_port(), tmp_path / "release"
    script = tmp_path / "train.py"
    script.write_text(f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.1)\n")
    command = torchrun(str(script))
    watched = start_watch(
        run_dir,
        "--exporter-port",
        str(port),
        "--",
        *command,
        env={WATCH_HINT_SECONDS_ENV: "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    try:

        def processes() -> float:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return 0.0
            return next(
                (
                    float(line.split()[-1])
                    for line in text.splitlines()
                    if line.startswith(catalog.WATCH_COMMAND_PROCESSES.name + " ")
                ),
                0.0,
            )

        wait_for(lambda: processes() >= 3, watched)  # torchrun and its 2 workers
        diagnosed = run_trainstack("diagnose", "--url", f"http://127.0.0.1:{port}", "--interval", "0.5", "--json")
        time.sleep(1.5)  # past the hint's second: it is said once, not at every poll
        release.touch()
        output, _ = watched.communicate(timeout=120)
    finally:
        kill_tree(watched)
    assert diagnosed.returncode == 0, explain(diagnosed)
    diagnosis = json.loads(diagnosed.stdout)
    assert diagnosis["verdicts"] == [] and "no-training" not in diagnosed.stdout.lower()
    assert (diagnosis["healthy"], diagnosis["judged"]) == (False, False)  # nothing judged is no health
    assert "no rank reports telemetry" in diagnosis["not_judged"]
    (note,) = diagnosis["notes"]
    assert note.startswith(
        "uninstrumented: 3 process(es) of the watched command are running with no rank telemetry "
        "(no GPU here, so nothing can be judged); for per-rank verdicts"
    ), note
    assert watched.returncode == 0, output
    assert output.count("trainstack watch: uninstrumented: the command runs, but no rank has started records") == 1
    # watch instruments by itself here: what it did not find, not advice to turn it on
    assert "the automatic instrumentation has found no DDP or FSDP model, Lightning or transformers Trainer" in output
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert (summary["command"], summary["exit_code"], summary["exit_reason"]) == (shlex.join(command), 0, "completed")
    assert summary["wall_seconds"] > 1 and summary["time_breakdown"] is None
    assert summary["judged"] is False and summary["not_judged"].startswith("no rank recorded a step")
    assert "verdicts" not in summary
    # The end of the run says so in one line, never HEALTHY, then where the report is.
    assert f"trainstack watch: NOT JUDGED  {summary['not_judged']}\ntrainstack watch: report: " in output
    assert "HEALTHY" not in output
    page = RunDir(run_dir).report.read_text()
    assert html.escape(shlex.join(command)) in page and "<td>exit code</td><td>0</td>" in page
    assert "<td>duration</td>" in page and "No rank records" in page
    assert re.search(r"<td>started</td><td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]+</td>", page)  # a zoned date, not 1.8e9


@pytest.mark.slow
def test_watch_loads_no_torch(tmp_path):
    outcome = run_without_torch(
        "watch",
        "--run-dir",
        str(tmp_path / "run"),
        *NO_EXPORTER,
        "--no-report",
        "--",
        sys.executable,
        "-c",
        "raise SystemExit(4)",
    )
    assert outcome["exit"] == 4 and outcome["loaded"] == [], outcome
