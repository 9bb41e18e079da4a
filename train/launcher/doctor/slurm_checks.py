"""What matters in a Slurm job (SLURM_JOB_ID set; docs/slurm.md, "The doctor under Slurm"): every node of the step
sees the same run directory, the job has a warning signal that leads to a checkpoint, and the job has the GPUs it
asked for. The ports are the other checks' (port_checks.py), on the ports the launcher derived from the job id.

Every node sees the run directory: a roll call in it. Each node writes its marker into RUN_DIR/.roll-call/<run id>/
(RunDir.roll_call; roll_call_key) and waits until it sees every node's; it then writes that it saw them all, and node 0, once every node has said so,
removes the folder (so no node removes a marker another has yet to see). A node that does not see them all within
the timeout (TRAINSTACK_SHARED_DIR_TIMEOUT, 180 s: longer than the batch scripts' --wait-for-lease, which may hold a
node back) fails, removing its own files. A node-local --output-dir (/tmp on each node) fails on every node.

The warning signal: slurm-wlm 22.05's `scontrol show job` has no field for --signal (seen on the test cluster), so
it is read where it can be: SBATCH_SIGNAL in the job's environment (sbatch's own variable, which wins over the
script), else the batch script's #SBATCH lines (`scontrol write batch_script JOB -`). A --signal given on sbatch's
command line leaves no trace in the job, so the check warns rather than fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from trainstack.rundir import RUN_ID_ENV, RunDir, roll_call_marker
from trainstack.slurm import JOB_ID_ENV
from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status

SHARED_DIR_TIMEOUT_ENV = "TRAINSTACK_SHARED_DIR_TIMEOUT"
DEFAULT_SHARED_DIR_TIMEOUT = 180.0
POLL_SECONDS = 0.25
SHARED_FIX = (
    "pass --output-dir a folder every node mounts at the same path (a shared file system: NFS, Lustre, GPFS), not "
    "a node-local one such as /tmp; a node that did not start says why in the job's output"
)
SIGNAL_FIX = (
    "add `#SBATCH --signal=B:TERM@120` to the batch script and pass it on to the step as "
    "examples/slurm/multi-node.sbatch does (an interactive job: srun --signal=TERM@120)"
)
# sbatch's --signal: [{R|B}:]<signal>[@<seconds>], 60 s when no time is given (Slurm's documentation)
SIGNAL_SPEC = re.compile(r"^(?:(?P<flags>[RB]+):)?(?P<signal>[A-Za-z0-9]+)(?:@(?P<seconds>\d+))?$")
DEFAULT_SIGNAL_SECONDS = 60


def in_slurm_job(config: DoctorConfig) -> bool:
    return bool(config.env.get(JOB_ID_ENV))


# ---- every node sees the same run directory -------------------------------------------------------------------


def roll_call_key(env) -> str:
    """The same on every node of one launch: its run id (TRAINSTACK_RUN_ID, which the nodes of a multi-node run
    share, and the batch scripts set per segment), so that nodes started by separate sruns meet too; without one,
    the job step and segment."""
    if env.get(RUN_ID_ENV):
        return env[RUN_ID_ENV]
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "batch"
    return f"slurm-{env[JOB_ID_ENV]}.{step}-{env.get('SLURM_RESTART_COUNT') or 0}"


def _names(folder: Path) -> set[str]:
    try:
        return set(os.listdir(folder))  # a listing, not a lookup per name: NFS revalidates a folder it lists
    except OSError:
        return set()


def _wait_for(folder: Path, wanted: set[str], deadline: float) -> set[str]:
    """The names of `wanted` still missing from `folder` at the deadline (none: all there before it)."""
    while True:
        missing = wanted - _names(folder)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(POLL_SECONDS)


def roll_call(folder: Path, node_rank: int, nnodes: int, timeout: float, who: str = "") -> list[int]:
    """Each of `nnodes` nodes calls this with the same `folder`: the node ranks this node did not see there within
    `timeout` seconds ([] when it saw every one). A node that saw them all leaves its files for node 0, which
    removes the folder once every node has said it saw them all; a node that did not removes its own files."""
    folder.mkdir(parents=True, exist_ok=True)
    marker, seen_all = roll_call_marker(folder, node_rank), roll_call_marker(folder, node_rank, seen=True)
    seen_all.unlink(missing_ok=True)  # an earlier call's, cut short
    names = {roll_call_marker(folder, n).name: n for n in range(nnodes)}
    try:
        marker.write_text(f"{who or socket.gethostname()} pid {os.getpid()}\n")
        missing = _wait_for(folder, set(names), time.monotonic() + timeout)
    except BaseException:  # SIGTERM while waiting (the launcher's SystemExit): leave nothing behind either
        _withdraw(marker)
        raise
    if missing:
        _withdraw(marker)
        return sorted(names[name] for name in missing)
    seen_all.write_text("")
    if node_rank == 0:
        # Every node saw every marker once its `.seen` is there; a node that died first cannot hold node 0 longer.
        seen = {roll_call_marker(folder, n, seen=True).name for n in range(nnodes)}
        _wait_for(folder, seen, time.monotonic() + timeout)
        shutil.rmtree(folder, ignore_errors=True)
        _remove_if_empty(folder.parent)
    return []


def tidy_roll_calls(run_dir: Path, env) -> list[str]:
    """Removes the roll calls in `run_dir` of launches other than this one (`roll_call_key`): a node killed while it
    waited leaves its marker, which nothing else removes. Only for a launcher that holds the run directory's lease,
    which no other launch's nodes hold meanwhile. The names of those removed."""
    here = RunDir(run_dir).roll_call(roll_call_key(env))
    stale = sorted(_names(here.parent) - {here.name})
    for name in stale:
        shutil.rmtree(here.parent / name, ignore_errors=True)
    _remove_if_empty(here.parent)
    return stale


def _withdraw(marker: Path) -> None:
    """A node's marker out of a roll call that failed, with the folders once empty."""
    marker.unlink(missing_ok=True)
    _remove_if_empty(marker.parent)
    _remove_if_empty(marker.parent.parent)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # another node's files, or another step's roll call, still in it


def shared_dir_timeout(env) -> float | None:
    """TRAINSTACK_SHARED_DIR_TIMEOUT in seconds (DEFAULT_SHARED_DIR_TIMEOUT unset); None: not a number above 0."""
    value = env.get(SHARED_DIR_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_SHARED_DIR_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def check_shared_run_dir(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    name = "shared-run-dir"
    run_dir = config.output_dir.absolute()
    if config.nnodes == 1:
        return CheckResult(name, Status.PASS, f"one node: no other node needs to see {run_dir}")
    if not config.roll_call:
        return CheckResult(
            name,
            Status.WARN,
            f"not checked (--skip-doctor): whether every node sees {run_dir}",
            "launch without --skip-doctor, or run `trainstack doctor` on every node of the job, to check it",
        )
    timeout = shared_dir_timeout(config.env)
    if timeout is None:
        return CheckResult(
            name,
            Status.FAIL,
            f"{SHARED_DIR_TIMEOUT_ENV}={config.env[SHARED_DIR_TIMEOUT_ENV]!r} is not a number of seconds above 0",
            f"unset {SHARED_DIR_TIMEOUT_ENV} (default {DEFAULT_SHARED_DIR_TIMEOUT:g} s) or set it to seconds",
        )
    this = f"node {config.node_rank}" + (f" ({node})" if (node := config.env.get("SLURMD_NODENAME")) else "")
    started = time.monotonic()
    try:
        missing = roll_call(
            RunDir(run_dir).roll_call(roll_call_key(config.env)), config.node_rank, config.nnodes, timeout, this
        )
    except OSError as error:
        return CheckResult(
            name, Status.FAIL, f"{this} cannot write its marker in {run_dir} ({error.strerror})", SHARED_FIX
        )
    if not missing:
        return CheckResult(
            name,
            Status.PASS,
            f"all {config.nnodes} nodes see {run_dir} (each node's marker seen within "
            f"{time.monotonic() - started:.1f} s)",
        )
    others = ", ".join(str(n) for n in missing)
    alone = len(missing) == config.nnodes - 1
    return CheckResult(
        name,
        Status.FAIL,
        f"{this} saw {'no other node' if alone else f'no marker of node(s) {others}'} in {run_dir} within "
        f"{timeout:g} s: {'this node does not share the run directory with the others' if alone else 'they do not'}"
        f" (or {'they' if alone else 'those'} did not start)",
        SHARED_FIX,
    )


# ---- the warning signal before the time limit -----------------------------------------------------------------


def scontrol_batch_script(job_id: str) -> str | None:
    """The job's batch script as Slurm keeps it, or None (no scontrol, no batch script: salloc or srun alone)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        result = subprocess.run(
            ["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 and result.stdout else None


def sbatch_signal(script: str) -> str | None:
    """The value of the last --signal among the script's #SBATCH lines, which sbatch reads up to its first
    command; None without one."""
    found = None
    for line in script.splitlines()[1:]:  # the first is the interpreter line
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        match = re.match(r"#SBATCH\s+--signal(?:=|\s+)(\S+)", stripped)
        if match:
            found = match.group(1)
    return found


def signal_name(value: str) -> str | None:
    """A signal as its name without SIG (TERM for 15, SIGTERM or TERM); None when it is none."""
    try:
        number = int(value)
    except ValueError:
        name = value.upper().removeprefix("SIG")
        return name if hasattr(signal, f"SIG{name}") else None
    try:
        return signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return None


def check_warning_signal(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    name = "warning-signal"
    job_id = config.env[JOB_ID_ENV]
    spec, where = config.env.get("SBATCH_SIGNAL"), "SBATCH_SIGNAL"
    if not spec:
        script = (config.read_batch_script or scontrol_batch_script)(job_id)
        if script is None:
            return CheckResult(
                name,
                Status.WARN,
                f"cannot read job {job_id}'s batch script (an interactive job has none): whether Slurm warns "
                "before the time limit is unknown, and without a warning the steps since the last checkpoint "
                "are lost",
                SIGNAL_FIX,
            )
        spec, where = sbatch_signal(script), "the batch script's #SBATCH --signal"
    if not spec:
        return CheckResult(
            name,
            Status.WARN,
            f"job {job_id} sets no warning signal (no #SBATCH --signal, no SBATCH_SIGNAL; one on sbatch's command "
            "line leaves no trace): at the time limit Slurm ends the job without a checkpoint",
            SIGNAL_FIX,
        )
    match = SIGNAL_SPEC.match(spec)
    named = signal_name(match.group("signal")) if match else None
    if match is None or named is None:
        return CheckResult(name, Status.WARN, f"{where} {spec!r} is not like B:TERM@120", SIGNAL_FIX)
    seconds = int(match.group("seconds") or DEFAULT_SIGNAL_SECONDS)
    to = "the batch shell, which must pass it on to the step" if "B" in (match.group("flags") or "") else "the steps"
    sent = f"Slurm sends SIG{named} to {to} {seconds} s before the time limit ({where} {spec})"
    if named != "TERM":
        return CheckResult(
            name,
            Status.WARN,
            f"{sent}: trainstack checkpoints on SIGTERM only (USR1 and USR2 are Lightning's and submitit's)",
            SIGNAL_FIX,
        )
    return CheckResult(
        name,
        Status.PASS,
        f"{sent}: the launcher checkpoints and exits 75; {seconds} s must cover log_every + 1 steps and a "
        "checkpoint write",
    )


# ---- the GPUs the job asked for -------------------------------------------------------------------------------


def check_job_gpus(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    name = "job-gpus"
    value = config.env.get("SLURM_GPUS_ON_NODE", "").strip()
    visible = gpus.torch_device_count
    shown = config.env.get("CUDA_VISIBLE_DEVICES")
    cuda = f"CUDA sees {visible}" + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
    try:
        asked = int(value) if value else 0
    except ValueError:
        return CheckResult(
            name,
            Status.FAIL,
            f"SLURM_GPUS_ON_NODE={value!r} is not a number",
            "leave SLURM_GPUS_ON_NODE to Slurm",
        )
    if asked == 0 and visible == 0:
        return CheckResult(name, Status.PASS, "no GPUs asked on this node: CPU ranks")
    if asked == 0:
        return CheckResult(
            name,
            Status.WARN,
            f"the job asked for no GPU on this node, yet {cuda}: Slurm gave them to no one here, and another job "
            "may be using them",
            "ask for them (#SBATCH --gpus-per-node=N; Slurm then sets CUDA_VISIBLE_DEVICES), or pass --cpu",
        )
    if visible < asked:
        return CheckResult(
            name,
            Status.WARN,
            f"the job has {asked} GPU(s) on this node (SLURM_GPUS_ON_NODE) but {cuda}: "
            f"{asked - visible} would sit idle",
            "leave CUDA_VISIBLE_DEVICES as Slurm sets it; if it is Slurm's, check the node's driver (nvidia-smi)",
        )
    if visible > asked:
        return CheckResult(
            name,
            Status.WARN,
            f"the job has {asked} GPU(s) on this node (SLURM_GPUS_ON_NODE) but {cuda}: one rank per visible GPU "
            "would use GPUs Slurm gave to other jobs",
            f"pass --nproc-per-node {asked}; ask the cluster's admins to confine jobs to their GPUs "
            "(ConstrainDevices=yes in cgroup.conf)",
        )
    return CheckResult(name, Status.PASS, f"the job has {asked} GPU(s) on this node and {cuda}")


CHECKS = (check_warning_signal, check_job_gpus, check_shared_run_dir)
"""In the order they run: the roll call last, since it waits for the other nodes."""
