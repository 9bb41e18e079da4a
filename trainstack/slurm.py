"""Slurm's environment as the world trainstack's launcher needs: this node's rank, the node count, the rendezvous
host and port, the tasks and GPUs on this node, the node's name, the job id and how often the job was requeued.

The model is the one pytorch/examples' Slurm scripts use: `srun` starts one task per node, and each task starts
that node's ranks (`trainstack train`, or `trainstack watch -- torchrun ...`). Read only where torchrun's variables
are absent: when torchrun runs under srun, its own world (RANK, GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) wins, as
in Lightning's cluster environments, since torchrun's ranks are what a process is.

What Slurm sets, as seen on Debian's slurm-wlm 22.05 (tests/process/test_slurm.py runs one): a job step's tasks get
SLURM_JOB_ID, SLURM_NODEID (within the step), SLURM_STEP_NUM_NODES and SLURM_JOB_NUM_NODES, SLURM_STEP_NODELIST and
SLURM_JOB_NODELIST in the compact hostlist syntax (`n[1-2]`), SLURM_STEP_TASKS_PER_NODE (`2(x3),1`),
SLURMD_NODENAME, SLURM_STEP_ID; SLURM_GPUS_ON_NODE where GPUs were allocated; SLURM_RESTART_COUNT only once the
job has been requeued. The step's nodes are the world: `srun -N1` in a 2-node job starts one node. The batch script itself runs on the first
node only, with SLURM_NODEID=0 and no SLURM_STEP_ID: a multi-node launch from there, without srun, would wait for
nodes that never start, so it is refused.

Torch-free and quick: the launcher, the doctor and `trainstack watch` read it before anything heavy.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainstack.errors import ConfigError

JOB_ID_ENV = "SLURM_JOB_ID"
# Each task of torchrun has these; all four, as Lightning's TorchElasticEnvironment checks.
TORCHELASTIC_VARIABLES = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# The rendezvous port of a job: MASTER_PORT_BASE + job id mod MASTER_PORT_SPAN. Above the privileged ports and below
# Linux's ephemeral range (32768-60999), where the OS picks its outgoing ports, and away from torchrun's 29500 and the
# exporter's 9450; two jobs on one node collide only when their ids differ by a multiple of the span, and then the
# check on node 0 (trainstack/rundir.py's bind_error) says so before any rank starts.
MASTER_PORT_BASE = 15000
MASTER_PORT_SPAN = 10000

# Each node's exporter port: EXPORTER_PORT_BASE + (job id mod EXPORTER_JOB_SLOTS) * EXPORTER_NODE_SLOTS + node rank
# mod EXPORTER_NODE_SLOTS, 25000-29399. A block of ports per job, one per node, since two nodes of one job may share
# a host (several slurmd on one machine, as in the tests); on a real cluster each node is its own host and only the
# job's block counts. Above the privileged ports, below Linux's ephemeral range (32768 up), above the rendezvous
# ports (MASTER_PORT_BASE's span, 15000-24999) and below torchrun's 29400 and 29500. Two jobs on one host collide
# only when their ids differ by a multiple of EXPORTER_JOB_SLOTS (550), and then the launcher's check (bind_error)
# says so before any rank starts.
EXPORTER_PORT_BASE = 25000
EXPORTER_NODE_SLOTS = 8
EXPORTER_JOB_SLOTS = 550

RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """The host names of Slurm's compact hostlist syntax, in order: `n[1-3,5],gpu-[01-02]` is n1, n2, n3, n5,
    gpu-01, gpu-02. A range keeps its lower bound's zero padding; several bracket groups in one name multiply
    (`r[1-2]n[1-2]` is r1n1, r1n2, r2n1, r2n2), and a name may go on after its brackets (`a[1-2]-ib`, which
    slurm-wlm 22.05's scontrol refuses). ConfigError on anything else (an unclosed bracket, a range that runs
    backwards, an empty name)."""
    hosts: list[str] = []
    for name in _split_top_level(hostlist):
        parts: list[list[str]] = []
        rest = name
        while rest:
            opening = rest.find("[")
            if opening < 0:
                if "]" in rest:
                    raise ConfigError(f"hostlist {hostlist!r}: ']' without '['")
                parts.append([rest])
                break
            closing = rest.find("]", opening)
            if closing < 0:
                raise ConfigError(f"hostlist {hostlist!r}: '[' without ']'")
            if "]" in rest[:opening]:
                raise ConfigError(f"hostlist {hostlist!r}: ']' without '['")
            parts.append([rest[:opening]])
            parts.append(_expand_ranges(rest[opening + 1 : closing], hostlist))
            rest = rest[closing + 1 :]
        hosts.extend("".join(combination) for combination in itertools.product(*parts))
    if not hosts:
        raise ConfigError(f"hostlist {hostlist!r} names no host")
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    """The comma- (or space-) separated names of a hostlist, commas inside brackets left alone."""
    names: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char in ", " and depth == 0:
            names.append("".join(current))
            current = []
        else:
            current.append(char)
    names.append("".join(current))
    if any(name == "" for name in names):
        raise ConfigError(f"hostlist {hostlist!r} has an empty name")
    return names


def _expand_ranges(ranges: str, hostlist: str) -> list[str]:
    numbers: list[str] = []
    for part in ranges.split(","):
        match = RANGE.match(part)
        if match is None:
            raise ConfigError(f"hostlist {hostlist!r}: {part!r} is not a number or a range like 1-4")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ConfigError(f"hostlist {hostlist!r}: range {part!r} runs backwards")
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers


def scontrol_hostnames(hostlist: str) -> list[str] | None:
    """Slurm's own expansion (`scontrol show hostnames`), or None where scontrol is not there or fails: it needs
    the cluster's slurm.conf, and says "Invalid hostlist" on stderr, with nothing on stdout, for a list it refuses."""
    if shutil.which("scontrol") is None:
        return None
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = result.stdout.split()
    return hosts if result.returncode == 0 and hosts else None


def hostnames(hostlist: str) -> list[str]:
    """The hosts of `hostlist`: Slurm's expansion where scontrol runs, else expand_hostlist's."""
    return scontrol_hostnames(hostlist) or expand_hostlist(hostlist)


def tasks_per_node(spec: str) -> list[int]:
    """SLURM_TASKS_PER_NODE's counts, one per node: `2(x3),1` is [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec!r} is not like 2(x3),1")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def master_port_of(job_id: int) -> int:
    """The rendezvous port every node of job `job_id` derives alike, with no message between them."""
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def exporter_port_of(job_id: int, node_rank: int) -> int:
    """The exporter port of node `node_rank` of job `job_id` (EXPORTER_PORT_BASE's rule): known to every node and to
    a person reading the job id, with no message between them."""
    return EXPORTER_PORT_BASE + (job_id % EXPORTER_JOB_SLOTS) * EXPORTER_NODE_SLOTS + node_rank % EXPORTER_NODE_SLOTS


def under_torchelastic(environ: Mapping[str, str]) -> bool:
    """Whether this process is one of torchrun's ranks, whose world torchrun set (it wins over Slurm's)."""
    return all(name in environ for name in TORCHELASTIC_VARIABLES)


def _int(environ: Mapping[str, str], *names: str, minimum: int = 0) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value == "":
            continue
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r} must be a whole number") from None
        if number < minimum:
            raise ConfigError(f"{name}={value!r} must be {minimum} or more")
        return number
    return None


def gpus_on_node(environ: Mapping[str, str]) -> int | None:
    """GPUs Slurm gave this node's tasks: SLURM_GPUS_ON_NODE, else the entries of CUDA_VISIBLE_DEVICES (which Slurm
    sets from the GRES it allocated), else None (none asked for, or not known)."""
    count = _int(environ, "SLURM_GPUS_ON_NODE")
    if count is not None:
        return count
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = [entry for entry in visible.split(",") if entry.strip()]
    return len(entries)


@dataclass(frozen=True)
class SlurmWorld:
    """Where this task of a Slurm job runs. Built by from_environ; every field is checked on construction, so a
    nonsense value (a node rank beyond the node count, a host list of the wrong length) is one ConfigError line."""

    job_id: int
    """SLURM_JOB_ID: the same for every node and every requeued segment of the job."""
    node_rank: int
    """SLURM_NODEID: this node's index among the step's nodes (the job's, in the batch script), 0 for the first."""
    nnodes: int
    """SLURM_STEP_NUM_NODES in a step, else SLURM_JOB_NUM_NODES (or SLURM_NNODES)."""
    hosts: tuple[str, ...]
    """SLURM_STEP_NODELIST in a step, else SLURM_JOB_NODELIST, expanded in Slurm's order: one per node."""
    master_port: int
    """MASTER_PORT_BASE + job id mod MASTER_PORT_SPAN (master_port_of)."""
    tasks_on_node: int
    """Tasks Slurm starts on this node (SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE); trainstack wants 1."""
    gpus_on_node: int | None
    """SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES's entries; None when neither says."""
    node_name: str
    """SLURMD_NODENAME: the node's Slurm name, which tells apart two nodes on one host (the tests' n1 and n2)."""
    restart_count: int
    """SLURM_RESTART_COUNT: how often the job was requeued (0 in its first segment, where Slurm leaves it unset)."""
    in_step: bool
    """Whether this is a job step's task (srun; SLURM_STEP_ID is set), not the batch script itself."""

    def __post_init__(self) -> None:
        if self.job_id < 0:
            raise ConfigError(f"SLURM_JOB_ID={self.job_id} must be 0 or more")
        if self.nnodes < 1:
            raise ConfigError(f"Slurm's node count {self.nnodes} must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"SLURM_NODEID={self.node_rank} must be in 0..{self.nnodes - 1} for {self.nnodes} nodes")
        if len(self.hosts) != self.nnodes:
            raise ConfigError(
                f"Slurm's node list names {len(self.hosts)} host(s) but its node count is {self.nnodes} "
                "(SLURM_STEP_NODELIST / SLURM_JOB_NODELIST against SLURM_STEP_NUM_NODES / SLURM_JOB_NUM_NODES)"
            )
        if not 1 <= self.master_port <= 65535:
            raise ConfigError(f"master port {self.master_port} is not a TCP port")
        if self.tasks_on_node < 1:
            raise ConfigError(f"{self.tasks_on_node} Slurm tasks on this node: there must be at least 1")
        if self.gpus_on_node is not None and self.gpus_on_node < 0:
            raise ConfigError(f"SLURM_GPUS_ON_NODE={self.gpus_on_node} must be 0 or more")
        if self.restart_count < 0:
            raise ConfigError(f"SLURM_RESTART_COUNT={self.restart_count} must be 0 or more")

    @property
    def master_addr(self) -> str:
        """The rendezvous host: the job's first node, where node rank 0 runs."""
        return self.hosts[0]

    def check_launchable(self) -> None:
        """ConfigError unless this task can start its node's ranks: in a job step (not the batch script, when the
        job has more than one node) and alone on its node (one srun task per node: `--ntasks-per-node=1`)."""
        if self.nnodes > 1 and not self.in_step:
            raise ConfigError(
                f"this is job {self.job_id}'s batch script on its first node only, and the job has {self.nnodes} "
                "nodes: start trainstack with `srun --ntasks-per-node=1` (examples/slurm/multi-node.sbatch)"
            )
        if self.tasks_on_node > 1:
            raise ConfigError(
                f"Slurm started {self.tasks_on_node} tasks on node {self.node_name}, and each would start every "
                "rank of the node: run one task per node (srun --ntasks-per-node=1); trainstack starts the ranks"
            )

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], expand: Callable[[str], list[str]] = hostnames
    ) -> SlurmWorld | None:
        """The Slurm world of `environ`, or None outside a Slurm job, or under torchrun (whose world wins).
        expand: how to expand the host list (Slurm's scontrol by default; expand_hostlist in the unit tests)."""
        job_id = _int(environ, JOB_ID_ENV, "SLURM_JOBID")
        if job_id is None or under_torchelastic(environ):
            return None
        # A step's own nodes first: `srun -N1` in a 2-node job runs on one node, whose SLURM_NODEID (0) counts
        # within the step, and SLURM_JOB_NUM_NODES still says 2 (seen on slurm-wlm 22.05).
        nnodes = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", minimum=1) or 1
        node_rank = _int(environ, "SLURM_NODEID") or 0
        hostlist = next(
            (
                environ[name]
                for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                if environ.get(name)
            ),
            None,
        )
        if not hostlist:
            raise ConfigError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: is this a Slurm job's environment?")
        node_name = environ.get("SLURMD_NODENAME") or ""
        spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        tasks = 1
        if spec:
            counts = tasks_per_node(spec)
            tasks = counts[min(node_rank, len(counts) - 1)]
        hosts = tuple(expand(hostlist))
        return cls(
            job_id=job_id,
            node_rank=node_rank,
            nnodes=nnodes,
            hosts=hosts,
            master_port=master_port_of(job_id),
            tasks_on_node=tasks,
            gpus_on_node=gpus_on_node(environ),
            node_name=node_name or (hosts[node_rank] if 0 <= node_rank < len(hosts) else ""),
            restart_count=_int(environ, "SLURM_RESTART_COUNT") or 0,
            in_step="SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ,
        )

    def describe(self) -> str:
        """One line: what the launcher will use."""
        gpus = "?" if self.gpus_on_node is None else str(self.gpus_on_node)
        return (
            f"slurm job {self.job_id} node {self.node_rank}/{self.nnodes} ({self.node_name}) "
            f"master {self.master_addr}:{self.master_port} tasks {self.tasks_on_node} gpus {gpus} "
            f"restarts {self.restart_count} step {'yes' if self.in_step else 'no'}"
        )


if __name__ == "__main__":  # `python -m trainstack.slurm`: what this task's Slurm environment says, in one line
    import os
    import sys

    try:
        world = SlurmWorld.from_environ(os.environ)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(world.describe() if world else "not in a Slurm job (or under torchrun, whose world wins)")
