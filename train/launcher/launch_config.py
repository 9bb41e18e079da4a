"""Where the ranks of `trainstack train` run: the world (ranks per node, nodes, this node's rank, rendezvous),
from the flags and the torchrun / Kubernetes / Kubeflow environment, then a Slurm job's (trainstack/slurm.py),
and the launcher's flags.

The launcher (commands/train.py) and `trainstack doctor` (train/launcher/doctor/cli.py) both build it, so
the doctor checks exactly the world the launcher would start; neither imports the other for it.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.rundir import (
    DEFAULT_EXPORTER_HOST,
    DEFAULT_EXPORTER_PORT,
    DEFAULT_LEASE_TIMEOUT_SECONDS,
    DEFAULT_MASTER_PORT,
    LEASE_TIMEOUT_ENV,
    PROMETHEUS_SD_DIR_ENV,
    SHOWN,
    bind_error,
    check_port,
    free_port,
)
from trainstack.slurm import EXPORTER_PORT_BASE, SlurmWorld, exporter_port_of
from trainstack.train.launcher.cuda_devices import cuda_device_count
from trainstack.train.rank import config as train_config

CPU_STAND_IN_RANKS = 2  # without a GPU: two gloo ranks, the smallest world that exercises DDP for real


def env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None
    return None


def node_rank_of(args: argparse.Namespace, slurm: SlurmWorld | None = None) -> int:
    """This node's rank: --node-rank, else the torchrun / Kubeflow / Indexed Job environment, else the Slurm job's
    (SLURM_NODEID) where `slurm` is given, else 0."""
    if args.node_rank is not None:
        return args.node_rank
    rank = env_int("NODE_RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX")
    if rank is not None:
        return rank
    return slurm.node_rank if slurm is not None else 0


def slurm_master_port(slurm: SlurmWorld, node_rank: int, check: bool = True) -> int:
    """The Slurm job's rendezvous port (derived from its id alike on every node), `check`ed free on node 0, where
    the rendezvous listens: another job on that node whose id differs by a multiple of the span holds it."""
    if check and node_rank == 0 and (error := bind_error("", slurm.master_port)) is not None:
        fix = "export MASTER_PORT=<a free port> in the batch script"
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {slurm.master_port}, the rendezvous port of Slurm job {slurm.job_id}, is in use on "
                f"{slurm.node_name or 'this node'}: {fix}"
            )
        raise ConfigError(f"cannot open port {slurm.master_port}, the rendezvous port ({error.strerror}): {fix}")
    return slurm.master_port


def exporter_port(args: argparse.Namespace, slurm: SlurmWorld | None, node_rank: int, check: bool = True) -> int:
    """--exporter-port; else, in a Slurm job, the port derived from the job id and this node's rank
    (trainstack/slurm.py's exporter_port_of), `check`ed free where the exporter binds (--exporter-host): another
    job's exporter on this host may hold it; else DEFAULT_EXPORTER_PORT."""
    if args.exporter_port is not None:
        return args.exporter_port
    if slurm is None:
        return DEFAULT_EXPORTER_PORT
    port = exporter_port_of(slurm.job_id, node_rank)
    error = bind_error(args.exporter_host, port) if check else None
    if error is None:
        return port
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        raise ConfigError(
            f"--exporter-host {args.exporter_host} is not an address of {slurm.node_name or 'this node'}: pass "
            "one of its addresses, or 0.0.0.0 for all of them"
        )
    if error.errno == errno.EADDRINUSE:
        raise ConfigError(
            f"port {port}, the exporter port of Slurm job {slurm.job_id} on node {node_rank} "
            f"({slurm.node_name or 'this node'}), is in use: pass --exporter-port <a free port> "
            "(EXPORTER_PORT=<port> in examples/slurm's scripts), or 0 for no exporter"
        )
    raise ConfigError(
        f"cannot open {args.exporter_host} port {port}, the exporter's ({error.strerror}): pass an --exporter-host "
        "this node can bind (0.0.0.0 for all its IPv4 addresses), or --exporter-port 0 for no exporter"
    )


def prometheus_sd_dir(args: argparse.Namespace) -> Path | None:
    """--prometheus-sd-dir, else PROMETHEUS_SD_DIR_ENV, else None (no target file)."""
    if args.prometheus_sd_dir is not None:
        return args.prometheus_sd_dir
    value = os.environ.get(PROMETHEUS_SD_DIR_ENV)
    return Path(value) if value else None


def _env_str(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


@dataclass
class LaunchConfig:
    """Where the ranks run. Flags win over the torchrun / Kubernetes / Kubeflow environment variables."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    use_cpu: bool
    exporter_port: int
    exporter_host: str
    rendezvous_timeout: float
    slurm: SlurmWorld | None = None
    """The Slurm job's world where the launcher runs in one (not under torchrun), for the exporter's target file."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank must be in 0..{self.nnodes - 1} for {self.nnodes} nodes, got {self.node_rank}"
            )
        if not 0 < self.rendezvous_timeout < float("inf"):
            raise ConfigError(f"--rendezvous-timeout must be positive seconds, got {self.rendezvous_timeout}")
        check_port("--master-port", self.master_port)
        check_port("--exporter-port", self.exporter_port, zero_means="to run no exporter")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @classmethod
    def from_args(cls, args: argparse.Namespace, check_ports: bool = True) -> LaunchConfig:
        """`check_ports`: refuse a port derived from a Slurm job that this node cannot open, in one line; `trainstack
        doctor` takes it unchecked, and its port checks show it as a FAIL beside the others."""
        gpus = cuda_device_count()
        use_cpu = args.cpu or gpus == 0
        # Kubeflow Trainer's runtimes set PET_NPROC_PER_NODE=auto|gpu|cpu: all mean "the default for this node".
        if os.environ.get("PET_NPROC_PER_NODE") in ("auto", "gpu", "cpu"):
            use_cpu = use_cpu or os.environ["PET_NPROC_PER_NODE"] == "cpu"
            os.environ.pop("PET_NPROC_PER_NODE")
        # 0 is the user's, refused as such (LaunchConfig), not taken for "not given"
        nproc = (
            args.nproc_per_node if args.nproc_per_node is not None else env_int("NPROC_PER_NODE", "PET_NPROC_PER_NODE")
        )
        if nproc is None:
            nproc = CPU_STAND_IN_RANKS if use_cpu else gpus
        elif not use_cpu and nproc > gpus:
            raise ConfigError(
                f"--nproc-per-node {nproc} but only {gpus} GPU(s) are visible; one rank per GPU "
                "(check CUDA_VISIBLE_DEVICES) or pass --cpu"
            )
        # Slurm's world only where the flags and torchrun's / Kubernetes' variables leave a part of it open.
        slurm = SlurmWorld.from_environ(os.environ)
        nnodes = args.nnodes if args.nnodes is not None else env_int("NNODES", "PET_NNODES")
        if nnodes is None and slurm is not None:
            slurm.check_launchable()  # not from a multi-node job's batch script, one task per node
            nnodes = slurm.nnodes
        nnodes = 1 if nnodes is None else nnodes
        node_rank = node_rank_of(args, slurm)
        master_port = args.master_port or env_int("MASTER_PORT", "PET_MASTER_PORT")
        if master_port is None and slurm is not None and nnodes > 1:
            master_port = slurm_master_port(slurm, node_rank, check_ports)
        if master_port is None:
            # A single-node job needs no fixed port; a free one lets several jobs share a host.
            master_port = DEFAULT_MASTER_PORT if nnodes > 1 else free_port()
        return cls(
            nproc_per_node=nproc,
            nnodes=nnodes,
            node_rank=node_rank,
            master_addr=args.master_addr
            or _env_str("MASTER_ADDR", "PET_MASTER_ADDR")
            or (slurm.master_addr if slurm is not None else "127.0.0.1"),
            master_port=master_port,
            use_cpu=use_cpu,
            exporter_port=exporter_port(args, slurm, node_rank, check_ports),
            exporter_host=args.exporter_host,
            rendezvous_timeout=args.rendezvous_timeout,
            slurm=slurm,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train_config.add_arguments(parser)
    group = parser.add_argument_group(
        "launch (flags win over torchrun/Kubernetes environment variables, which win over a Slurm job's)"
    )
    group.add_argument("--nproc-per-node", type=int, help="ranks on this node (default: one per GPU, 2 on CPU)")
    group.add_argument("--nnodes", type=int, help="nodes in the job (env NNODES or SLURM_JOB_NUM_NODES; default 1)")
    group.add_argument(
        "--node-rank", type=int, help="this node's rank (env NODE_RANK, JOB_COMPLETION_INDEX or SLURM_NODEID)"
    )
    group.add_argument(
        "--master-addr", help="rendezvous host: node 0's address (env MASTER_ADDR; Slurm: the job's first node)"
    )
    group.add_argument(
        "--master-port",
        type=int,
        help=f"rendezvous port (env MASTER_PORT; default: {DEFAULT_MASTER_PORT} multi-node, derived from the job id "
        "under Slurm, a free port single-node)",
    )
    group.add_argument(
        "--rendezvous-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the rendezvous host's name to resolve (default: 600)",
    )
    group.add_argument("--cpu", action="store_true", help="run CPU ranks over gloo even if GPUs are present")
    group.add_argument(
        "--skip-doctor",
        action="store_true",
        help="start even if a preflight check FAILs (trainstack doctor shows them), and under Slurm without waiting "
        "for the other nodes in the run directory",
    )
    add_beside_run_arguments(group)


def lease_wait(args: argparse.Namespace) -> float:
    """--wait-for-lease, checked."""
    if args.wait_for_lease < 0:
        raise ConfigError(f"--wait-for-lease must be 0 or more seconds, got {args.wait_for_lease:g}")
    return args.wait_for_lease


def add_beside_run_arguments(group: argparse._ActionsContainer) -> None:
    """What a launcher does beside the run it starts (`trainstack train`, `trainstack watch`): the exporter, the
    report at the end, the run directory's lease."""
    group.add_argument(
        "--exporter-port",
        type=int,
        help=f"metrics exporter port (default: {DEFAULT_EXPORTER_PORT}; in a Slurm job, one derived from the job id "
        f"and the node's rank, {EXPORTER_PORT_BASE} up, checked free; 0 turns it off)",
    )
    group.add_argument(
        "--exporter-host",
        default=DEFAULT_EXPORTER_HOST,
        help=f"address the exporter binds (default: {DEFAULT_EXPORTER_HOST}; pass 0.0.0.0 in a container)",
    )
    group.add_argument(
        "--prometheus-sd-dir",
        type=Path,
        metavar="DIR",
        help=f"write this node's exporter as a Prometheus file_sd target, DIR/<run id>-node<k>.json, once it serves, "
        f"and remove it when it stops: a folder Prometheus' host reads (env {PROMETHEUS_SD_DIR_ENV}; default: none)",
    )
    group.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"write {SHOWN.report} when the run ends (default: on)",
    )
    group.add_argument(
        "--wait-for-lease",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another launcher holds the run directory, wait this long for it to finish "
        "instead of exiting 2 (default: 0)",
    )
    group.add_argument(
        "--lease-timeout",
        type=float,
        metavar="SECONDS",
        help=f"a holder on another host whose heartbeat is older than this is taken over (env "
        f"{LEASE_TIMEOUT_ENV}; default: {DEFAULT_LEASE_TIMEOUT_SECONDS:g})",
    )
