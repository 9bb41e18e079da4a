"""Prometheus' file-based service discovery for a node's exporter: where the exporter of a node a scheduler picked
(Slurm's nodes, above all) can be scraped, written into a folder Prometheus reads (`file_sd_configs`), and
removed when the exporter stops.

One file per node and run, `<run id>-node<k>.json`, in Prometheus' file_sd format:
`[{"targets": ["host:port"], "labels": {...}}]`. Prometheus re-reads the folder while the files change, so each is
written through a temporary file and a rename (never seen half-written; the temporary name does not end in .json, so
a `*.json` pattern never matches it). The labels name the run and the node without clashing with the labels the
exporter's own series carry (`run_id`, `node`, `rank`): a target label of the same name would rename the series'
own to `exported_...` and break the dashboards' queries.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.slurm import SlurmWorld
from trainstack.write_failure import write_atomically

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # another host name
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def target_host(bind_host: str) -> str:
    """Where Prometheus, on another host, reaches an exporter bound to `bind_host`: that address when it names one;
    this host's name when it binds every address (`--exporter-host 0.0.0.0`), since a wildcard is no place to
    connect to, and a cluster's node names resolve on its other hosts."""
    host = socket.gethostname() if bind_host in WILDCARD_HOSTS else bind_host
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class FileSdTarget:
    """One exporter as a Prometheus file_sd target: `write()` once it serves, `remove()` once it has stopped."""

    path: Path
    target: str
    """host:port, as Prometheus connects to it."""
    labels: dict[str, str]

    def text(self) -> str:
        return json.dumps([{"targets": [self.target], "labels": self.labels}], indent=2) + "\n"

    def write(self) -> None:
        """The file, atomically; WriteFailure when the storage refuses it."""
        write_atomically(self.path, self.text(), "the Prometheus target file")

    def remove(self) -> None:
        """The file gone, if it is there; a storage that refuses leaves it for Prometheus to find down."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


def file_sd_target(
    folder: Path | None,
    run_id: str,
    node_rank: int,
    bind_host: str,
    port: int,
    slurm: SlurmWorld | None,
    warn: Callable[[str], None],
) -> FileSdTarget | None:
    """This node's target file in `folder` (--prometheus-sd-dir), or None where there is none to write (no folder,
    or no exporter: port 0). The folder is made if missing; ConfigError, before anything else is written, when it
    cannot be made or written. `warn` gets one line where the exporter binds loopback only, which a Prometheus on
    another host cannot reach."""
    if folder is None or port == 0:
        return None
    if _loopback(bind_host):
        warn(
            f"--exporter-host {bind_host} is reachable from this node only, so the target in --prometheus-sd-dir is "
            "of use to a Prometheus on this node alone: pass --exporter-host 0.0.0.0 for one on another host"
        )
    fix = "name a folder this node can write and Prometheus' host reads"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--prometheus-sd-dir {folder} is a file, not a folder: {fix}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--prometheus-sd-dir {folder}: cannot create it ({error.strerror}): {fix}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--prometheus-sd-dir {folder}: this node cannot write there: {fix}")
    labels = {"trainstack_run_id": run_id, "node_rank": str(node_rank)}
    if slurm is not None:
        labels.update(slurm_job_id=str(slurm.job_id), slurm_node=slurm.node_name)
    name = f"{UNSAFE_IN_NAME.sub('_', run_id)}-node{node_rank}.json"
    return FileSdTarget(folder / name, f"{target_host(bind_host)}:{port}", labels)
