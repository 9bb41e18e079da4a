"""Ports this node must open: the rendezvous port (node 0 only) and the exporter's."""

from __future__ import annotations

import errno
import socket

import psutil

from trainstack.rundir import bind_error, free_port
from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status
from trainstack.train.launcher.doctor.slurm_checks import in_slurm_job

BESIDE_THE_LAUNCHER = "if this job's own launcher holds it (the doctor run beside it), nothing to fix"


def listener(port: int) -> str:
    """Who listens on the port, when the OS tells us (other users' sockets need privileges)."""
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
                return f" by pid {connection.pid} ({psutil.Process(connection.pid).name()})"
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        pass
    return ""


def _port_result(
    name: str, host: str, port: int, shown_host: str, port_flag: str, host_flag: str, in_use_fix: str | None = None
) -> CheckResult:
    """`in_use_fix`: the fix for a port in use, where the generic one (stop the holder, or a port free here) is wrong."""
    error = bind_error(host, port)
    if error is None:
        return CheckResult(name, Status.PASS, f"{shown_host}:{port} is free")
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return CheckResult(
            name,
            Status.FAIL,
            f"{shown_host} is not an address of this host",
            f"pass an address of this host to {host_flag}",
        )
    if error.errno == errno.EADDRINUSE:
        return CheckResult(
            name,
            Status.FAIL,
            f"{shown_host}:{port} is already in use{listener(port)}",
            in_use_fix or f"stop that process, or pass {port_flag} {free_port(host)} (free now)",
        )
    fix = (
        f"pass {port_flag} with a port above 1023 this user may open"
        if error.errno == errno.EACCES
        else f"pass {host_flag} with an address this host can bind"  # an IPv6 host without IPv6, a link-local one
    )
    return CheckResult(name, Status.FAIL, f"cannot open {shown_host}:{port} ({error.strerror})", fix)


def check_rendezvous_port(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    if config.node_rank != 0:
        return CheckResult(
            "rendezvous-port",
            Status.PASS,
            f"node {config.node_rank} joins {config.master_addr}:{config.master_port}, which node 0 opens",
        )
    # The rendezvous store listens on every interface of node 0, whatever MASTER_ADDR names.
    return _port_result(
        "rendezvous-port",
        "",
        config.master_port,
        "*",
        "--master-port",
        "--master-addr",
        # Every node needs the same port, and the holder may be this job's own launcher (the doctor run beside it)
        f"{BESIDE_THE_LAUNCHER}; else export MASTER_PORT=<a port free on node 0> in the batch script"
        if in_slurm_job(config)
        else None,
    )


def check_exporter_port(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    if config.exporter_port == 0:
        return CheckResult("exporter-port", Status.PASS, "no exporter (--exporter-port 0)")
    return _port_result(
        "exporter-port",
        config.exporter_host,
        config.exporter_port,
        config.exporter_host,
        "--exporter-port",
        "--exporter-host",
        f"{BESIDE_THE_LAUNCHER}; else pass --exporter-port <a free port> (EXPORTER_PORT=<port> in examples/slurm's "
        "scripts), or 0 for no exporter"
        if in_slurm_job(config)
        else None,
    )
