"""Bad input under Slurm, on the real test cluster (tests/helpers/slurm.py), and the doctor's Slurm checks there
(train/launcher/doctor/slurm_checks.py): one line each, exit not 0, nothing lost.

- A batch script of examples/slurm/ run with bash, outside Slurm (no cluster needed).
- A 2-node `trainstack train` whose nodes each see a run directory of their own (`--output-dir` under the node's
  name, as a node-local /tmp would be): each node's doctor says it saw no other node, names the fix, the job fails
  without requeueing, and neither directory holds anything new.
- A 2-node `trainstack train` whose rendezvous port (derived from the job id) another process holds on the first
  node: that node refuses in one line, the other gives up when the first never answers the roll call.
- `srun trainstack doctor` on both nodes of a job submitted with `#SBATCH --signal=B:TERM@120`: the three Slurm
  checks pass on both.

The three jobs run side by side, the nodes' roll call timeout set to 8 s: about 30 s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.runs import REPO
from tests.helpers.slurm import SlurmCluster, cluster_or_skip, submit_multi_node
from trainstack.rundir import ROLL_CALL_DIR
from trainstack.slurm import master_port_of

pytestmark = pytest.mark.slow

TIMEOUT = "8"  # TRAINSTACK_SHARED_DIR_TIMEOUT: how long a node waits for the others in the run directory
DONE = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]
TRAIN = ("--cpu", "--nproc-per-node", "1", "--batch-size", "8", "--num-workers", "0", "--exporter-port", "0")


@pytest.mark.parametrize("name", ["one-node", "multi-node", "watch-torchrun"])
def test_a_batch_script_run_outside_slurm_says_to_submit_it_with_sbatch(tmp_path, name):
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM", "SBATCH"))}
    script = REPO / "examples" / "slurm" / f"{name}.sbatch"
    done = subprocess.run(
        ["bash", str(script), "--max-steps", "5"], cwd=tmp_path, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == f"{script}: not in a Slurm job (SLURM_JOB_ID is unset): submit it with sbatch {script} [flags]\n"
    )
    assert list(tmp_path.iterdir()) == []  # no run directory, no output file


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with cluster_or_skip(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def job_script(path: Path, body: str) -> Path:
    """A batch script of the test's own for 2 nodes, one CPU task each, with the examples' warning signal."""
    path.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --signal=B:TERM@120\n"
        'export TRAINSTACK_RUN_ID="slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"\n' + body
    )
    return path


def environment(**extra: str) -> dict[str, str]:
    """This checkout's trainstack on PATH, the test cluster's master address (its node names resolve nowhere) and
    the short roll call."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
        "TRAINSTACK_SHARED_DIR_TIMEOUT": TIMEOUT,
        **extra,
    }


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory) -> dict[str, tuple[str, Path, Path]]:
    """{"node-local", "port-taken", "doctor"}: (job id, output file, run directory), all three finished. The steps
    of the first and the last write each node's lines to a file of its own, `<name>-<task>.out` beside the output
    file (one task per node; the nodes' lines, written as they come, would mix in one)."""
    folder = tmp_path_factory.mktemp("jobs")
    found = {}
    # Each node's --output-dir under its own name: a folder no other node sees. n1's already holds a file.
    local = folder / "local"
    (local / "n1" / "run").mkdir(parents=True)
    (local / "n1" / "run" / "notes.txt").write_text("kept\n")
    script = job_script(
        folder / "node-local.sh",
        f"srun --kill-on-bad-exit=0 --output={folder}/node-local-%t.out "
        'bash -c \'exec trainstack train --output-dir "$ROOT/$SLURMD_NODENAME/run" "$@"\' _ "$@"\n',
    )
    output = folder / "node-local.out"
    found["node-local"] = (
        slurm.sbatch(f"--output={output}", str(script), *TRAIN, "--max-steps", "5", env=environment(ROOT=str(local))),
        output,
        local,
    )
    doctor_run, output = folder / "doctor-run", folder / "doctor.out"
    script = job_script(
        folder / "doctor.sh",
        f'srun --output={folder}/doctor-%t.out trainstack doctor --output-dir "{doctor_run}" "$@"\n',
    )
    found["doctor"] = (slurm.sbatch(f"--output={output}", str(script), *TRAIN, env=environment()), output, doctor_run)
    # Held until a process in the cluster's namespace listens on the rendezvous port the job will derive.
    taken_run, output = folder / "port-taken", folder / "port-taken.out"
    job_id = submit_multi_node(
        slurm, output, taken_run, "--max-steps", "5", options=("--hold",), TRAINSTACK_SHARED_DIR_TIMEOUT=TIMEOUT
    )
    holder = subprocess.Popen(
        slurm.in_namespace(
            [
                sys.executable,
                "-c",
                "import socket, time\n"
                f"s = socket.socket(); s.bind(('', {master_port_of(int(job_id))})); s.listen()\n"
                "print('listening', flush=True); time.sleep(300)",
            ]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        slurm.run(["scontrol", "release", job_id])
        found["port-taken"] = (job_id, output, taken_run)
        for job, _, _ in found.values():
            slurm.wait_job(job, DONE, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    return found


def test_nodes_that_see_run_directories_of_their_own_each_say_so_and_nothing_is_lost(slurm, jobs):
    job_id, output, local = jobs["node-local"]
    fields = slurm.job(job_id)
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("FAILED", "2:0", "0"), output.read_text()
    for rank, node in enumerate(("n1", "n2")):
        text = (output.parent / f"node-local-{rank}.out").read_text()
        failed = re.findall(rf"FAIL +shared-run-dir +node {rank} \({node}\) saw no other node in (\S+) within", text)
        assert failed == [str(local / node / "run")], text[-3000:]
        assert "fix: pass --output-dir a folder every node mounts at the same path" in text
        assert text.endswith(
            "trainstack train: error: preflight checks failed (FAIL above); fix them, or pass --skip-doctor to "
            "start anyway\n"
        )
        assert "Traceback" not in text
    # Neither run directory holds anything new (no lease, no roll call, no telemetry): n1's holds its file still,
    # and n2's, which the lease made, is gone with it.
    assert [path.name for path in (local / "n1" / "run").iterdir()] == ["notes.txt"]
    assert not (local / "n2").exists()


def test_a_rendezvous_port_in_use_is_one_line_and_the_other_node_gives_up(slurm, jobs):
    job_id, output, run_dir = jobs["port-taken"]
    text = output.read_text()
    fields = slurm.job(job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0"), text[-3000:]
    port = master_port_of(int(job_id))
    refused = (
        f"trainstack train: error: port {port}, the rendezvous port of Slurm job {job_id}, is in use on n1: "
        "export MASTER_PORT=<a free port> in the batch script"
    )
    # Counted, not matched as a line: srun --unbuffered passes on the line's end apart from its text, and srun's own
    # "task 0: Exited" line may come between them.
    assert text.count(refused) == 1, text[-3000:]
    assert re.search(rf"FAIL +shared-run-dir +node 1 \(n2\) saw no other node in {run_dir} within {TIMEOUT} s", text)
    assert "Traceback" not in text
    assert not run_dir.exists()  # made by node 1's lease, which removed it: its roll call left nothing in it


def test_the_doctors_slurm_checks_pass_on_both_nodes_of_a_job_that_shares_its_run_directory(slurm, jobs):
    job_id, output, run_dir = jobs["doctor"]
    text = "".join((output.parent / f"doctor-{task}.out").read_text() for task in (0, 1))
    assert slurm.job(job_id)["JobState"] == "COMPLETED", output.read_text() + text
    # The port checks on the rendezvous port the launcher derives from the job id: free on node 0, joined by node 1.
    port = master_port_of(int(job_id))
    first, second = ((output.parent / f"doctor-{task}.out").read_text() for task in (0, 1))
    assert re.search(rf"PASS +rendezvous-port +\*:{port} is free", first), first
    assert re.search(rf"PASS +rendezvous-port +node 1 joins 127.0.0.1:{port}, which node 0 opens", second), second
    assert len(re.findall(rf"PASS +shared-run-dir +all 2 nodes see {run_dir} ", text)) == 2, text[-3000:]
    signal = (
        r"PASS +warning-signal +Slurm sends SIGTERM to the batch shell, which must pass it on to the step 120 s "
        r"before the time limit \(the batch script's #SBATCH --signal B:TERM@120\)"
    )
    assert len(re.findall(signal, text)) == 2
    assert len(re.findall(r"PASS +job-gpus +no GPUs asked on this node: CPU ranks", text)) == 2
    assert not (run_dir / ROLL_CALL_DIR).exists()  # node 0 removed it once both had answered
