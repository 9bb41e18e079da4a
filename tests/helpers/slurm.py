"""A real Slurm for the tests: munge, one `slurmctld` and two `slurmd` (nodes n1 and n2) from Debian's packages,
each with the test's own configuration, key, spool and state folders, inside a network namespace of the test's
own that holds only loopback.

Why each setting (all found on this kind of machine, issue 44):
- the namespace: the daemons listen on every address; in a namespace with only loopback nothing outside reaches
  them and they reach nothing outside. It is entered with `nsenter --net=`, not `ip netns exec`, which remounts /sys
  and stops slurmd. 127.0.0.2 is added beside 127.0.0.1: Slurm's daemons find the address to listen on with
  getaddrinfo's AI_ADDRCONFIG, which with 127.0.0.1 alone found none here ("Name or service not known", then
  "Unable to bind listen port"), and they never came up.
- two `slurmd -N` on one host: Debian's build has MULTIPLE_SLURMD; each NodeName has its own Port=.
- ProctrackType=proctrack/pgid: with proctrack/linuxproc a job's background processes outlived it. No cgroups.
- TaskPlugin=task/none, no accounting, MailProg=/bin/true: nothing else to set up.
- AuthInfo=cred_expire=10: a requeued job may start again only once its credential has expired; with the default
  (120 s) it waited about 2 minutes. SchedulerParameters=sched_interval=1: then it starts within a second, not at
  the next minute's scheduling pass.

Only the processes started here are ended, by PID: the daemons, then whatever is still in the namespace (the
jobs' steps), which only this cluster could have started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "srun", "nsenter", "ip")
PACKAGES = "slurm-wlm and munge (make system-deps)"
NODES = ("n1", "n2")
CONTROLLER_PORT = 6817  # the namespace's own ports: nothing else listens there
NODE_PORTS = {"n1": 6818, "n2": 6819}
CPUS_PER_NODE = (
    4  # more than the machine has (SlurmdParameters=config_overrides): the jobs of a module run side by side
)


class SlurmUnavailable(RuntimeError):
    """This machine cannot give the cluster what it needs (a network namespace): a reason to skip, not a failure."""


def skip_reason() -> str | None:
    """Why a real Slurm cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a real Slurm needs root (munged, slurmd and network namespaces)"
    missing = [command for command in COMMANDS if shutil.which(command) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH: install {PACKAGES}"
    return None


def slurm_conf(root: Path, munge_socket: Path) -> str:
    host = socket.gethostname()
    lines = [
        "ClusterName=trainstack-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={CONTROLLER_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket},cred_expire=10",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd'}.%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd'}.%n.log",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        "SchedulerType=sched/builtin",
        # The main scheduling pass every second, not every 60 s: a requeued job, once it may begin again (its
        # BeginTime, cred_expire + 1 s after the requeue), waited for that pass up to a minute.
        "SchedulerParameters=sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        # The configured CPUs, not the machine's: the tests' jobs mostly wait, and side by side they take seconds.
        "SlurmdParameters=config_overrides",
        "KillWait=5",
        "MinJobAge=600",  # finished jobs stay in scontrol's view for the assertions
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "InactiveLimit=0",
        "MpiDefault=none",
    ]
    for name in NODES:
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={NODE_PORTS[name]} "
            f"CPUs={CPUS_PER_NODE} RealMemory=1000 State=UNKNOWN"
        )
    lines.append(f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def cluster_or_skip(root: Path) -> Iterator[SlurmCluster]:
    """A running cluster under `root` for a module's fixture; the test skips, saying why, where none can run."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(SlurmCluster(root))
        except SlurmUnavailable as error:
            pytest.skip(str(error))
        yield cluster


def submit_multi_node(
    cluster: SlurmCluster,
    output: Path,
    run_dir: Path,
    *train_args: str,
    exporters: bool = False,
    options: Sequence[str] = (),
    **env: str,
) -> str:
    """examples/slurm/multi-node.sbatch as a user submits it, running this checkout's `trainstack train` with
    `train_args` on both nodes, one CPU rank each: the job id. MASTER_ADDR=127.0.0.1, since the master is the
    job's first node, n1, a Slurm node name that resolves nowhere here (on a cluster node names resolve). No
    exporter (EXPORTER_PORT=0) unless `exporters`: then each node's launcher derives its own port (the job id and
    the node's rank), as on a cluster. `options` adds to sbatch's options (`--hold`), `env` to the job's
    environment."""
    environ = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "RUN_DIR": str(run_dir)}
    environ.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", **env)
    if not exporters:
        environ["EXPORTER_PORT"] = "0"
    return cluster.sbatch(
        *("--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=5"),
        f"--output={output}",
        *options,
        str(REPO / "examples/slurm/multi-node.sbatch"),
        *("--cpu", "--nproc-per-node", "1", "--batch-size", "8", "--num-workers", "0", "--no-report"),
        *train_args,
        env=environ,
    )


class SlurmCluster:
    """munge, slurmctld and slurmd n1, n2 under `root`, in a namespace of their own. A context manager: entering
    starts everything and waits until both nodes are idle; leaving ends what it started."""

    def __init__(self, root: Path, namespace: str | None = None) -> None:
        self.root = root
        self.namespace = namespace or f"tsslurm{os.getpid()}"
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.daemons: dict[str, subprocess.Popen] = {}
        self.made_namespace = False

    # ---- commands ---------------------------------------------------------------------------------------------
    @property
    def netns(self) -> Path:
        return Path("/run/netns") / self.namespace

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **(extra or {}), "SLURM_CONF": str(self.conf)}

    def in_namespace(self, command: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.netns}", *command]

    def run(
        self, command: Sequence[str], check: bool = True, timeout: float = 30, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """A client command (sbatch, squeue, scontrol, srun, scancel) in the namespace, with this cluster's
        SLURM_CONF and `env` added to this process's environment (sbatch passes it on to the job); check: a
        non-zero exit fails with its output."""
        result = subprocess.run(
            self.in_namespace(command), env=self.env(env), capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()}\n{self.logs()}"
            )
        return result

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Submits a job (`args`: sbatch's options, the script and its arguments) and returns its id."""
        return self.run(["sbatch", "--parsable", *args], env=env).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, NodeList, ExitCode...)."""
        text = self.run(["scontrol", "show", "job", "--oneliner", job_id]).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def wait_job(self, job_id: str, states: Sequence[str], timeout: float = 60) -> dict[str, str]:
        """The job's fields once its state is one of `states` (e.g. RUNNING, COMPLETED)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {fields.get('JobState')} after {timeout:g} s, not {states}")
            time.sleep(0.2)

    def node_states(self) -> dict[str, str]:
        text = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False).stdout
        return dict(line.split() for line in text.splitlines() if len(line.split()) == 2)

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (states := self.node_states()) != dict.fromkeys(NODES, "idle"):
            self.check_daemons()
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not idle after {timeout:g} s: {states}\n{self.logs()}")
            time.sleep(0.2)

    def logs(self, tail: int = 15) -> str:
        parts = []
        for log in (
            sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")) + [self.root / "munge" / "munged.log"]
        ):
            if not log.exists():
                continue
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def check_daemons(self) -> None:
        for name, process in self.daemons.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited {process.returncode}\n{self.logs()}")

    # ---- start and stop ---------------------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.make_namespace()
        munge = self.root / "munge"
        for folder in (munge, self.root / "state", *(self.root / "spool" / name for name in NODES)):
            folder.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o755)  # munged wants its socket's folder open to all (the key file stays 0600)
        key = munge / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        self.conf.write_text(slurm_conf(self.root, self.munge_socket))
        self.daemon(
            "munged",
            # --force: munged refuses a socket in a folder whose parents are not open to all, and pytest's
            # temporary root is 0700; with it, it warns and runs.
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}"]
            + [f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}"]
            + [f"--log-file={munge / 'munged.log'}"],
        )
        self.wait_for(lambda: self.munge_socket.exists(), "munged's socket")
        self.daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for name in NODES:
            self.daemon(f"slurmd {name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self.wait_idle()

    def make_namespace(self) -> None:
        steps = [
            ["netns", "add", self.namespace],
            ["-n", self.namespace, "link", "set", "lo", "up"],
            ["-n", self.namespace, "addr", "add", "127.0.0.2/8", "dev", "lo"],
        ]
        for step in steps:
            result = subprocess.run(["ip", *step], capture_output=True, text=True)
            if result.returncode != 0:
                raise SlurmUnavailable(
                    f"cannot make a loopback-only network namespace: ip {' '.join(step)}: {result.stderr.strip()}"
                )
            self.made_namespace = True

    def daemon(self, name: str, command: list[str]) -> None:
        log = (self.root / f"{name.replace(' ', '.')}.out").open("w")
        with log:
            self.daemons[name] = subprocess.Popen(
                self.in_namespace(command), env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )

    def wait_for(self, ready, what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.check_daemons()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout:g} s\n{self.logs()}")
            time.sleep(0.05)

    def namespace_pids(self) -> list[int]:
        """The processes in this cluster's namespace other than the daemons: the jobs' steps and their children."""
        if not self.netns.exists():
            return []
        inode = self.netns.stat().st_ino
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "ns" / "net").stat().st_ino == inode:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def stop(self) -> None:
        # The jobs first, so that the node daemons can end their steps; then the daemons, nodes before controller
        # and munge last (the others ask it to sign their last messages). Every step runs, whatever the one before
        # did: a controller that does not answer must not leave the daemons running.
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            try:
                self.run(["scancel", "--full", "--user=root"], check=False, timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(list(self.daemons)):
            end(self.daemons[name])
        for pid in self.namespace_pids():  # steps a node daemon left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.made_namespace:
            subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True)
            self.made_namespace = False


def end(process: subprocess.Popen, grace: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
