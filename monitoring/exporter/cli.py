"""`trainstack exporter` and `python -m trainstack.monitoring.exporter`: serve GPU and training metrics until
SIGTERM."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from pathlib import Path

from trainstack.errors import EXIT_OK, ConfigError, RuntimeFailure, exit_code
from trainstack.lifetime import watch_supervisor
from trainstack.monitoring.exporter.config import (
    DEFAULT_GPM_INTERVAL,
    DEFAULT_SAMPLE_INTERVAL,
    DEFAULT_SLOW_SAMPLE_INTERVAL,
    ExporterConfig,
)
from trainstack.rundir import DEFAULT_EXPORTER_HOST, DEFAULT_EXPORTER_PORT, SHOWN

log = logging.getLogger("trainstack.exporter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default=DEFAULT_EXPORTER_HOST,
        help=f"address to listen on (default {DEFAULT_EXPORTER_HOST}; 0.0.0.0 to let a remote Prometheus in)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_EXPORTER_PORT,
        help=f"port for /metrics and /healthz (default {DEFAULT_EXPORTER_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--metrics-dir",
        type=Path,
        default=None,
        help=f"the ranks' prometheus_client multiprocess directory ({SHOWN.node_metrics('<n>')}); "
        "without it only GPU metrics are served",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help=f"run directory: with a GPU, snapshots are appended to {SHOWN.gpu_log}",
    )
    parser.add_argument(
        "--pcie-throughput",
        action="store_true",
        help="also export PCIe throughput (each NVML call for it blocks ~20 ms per GPU)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=DEFAULT_SAMPLE_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between GPU samples (default {DEFAULT_SAMPLE_INTERVAL:g}); a scrape serves the "
        "latest sample and never waits for NVML",
    )
    parser.add_argument(
        "--slow-sample-interval",
        type=float,
        default=DEFAULT_SLOW_SAMPLE_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between reads of the costly fields: energy, violation time, PCIe replays, "
        f"ECC, NVLink, power limit, memory temperature (default {DEFAULT_SLOW_SAMPLE_INTERVAL:g})",
    )
    parser.add_argument(
        "--gpm-interval",
        type=float,
        default=DEFAULT_GPM_INTERVAL,
        metavar="SECONDS",
        help="seconds between GPM samples on Hopper and newer: SM, tensor and DRAM activity and link "
        f"traffic are served as means over it (default {DEFAULT_GPM_INTERVAL:g})",
    )
    parser.add_argument(
        "--nvml-module",
        default="pynvml",
        help="the module that provides the NVML API; trainstack.monitoring.nvml_fake is a fake "
        "host for trying the stack without a GPU (NVML_FAKE_HOST names the host)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: `trainstack --help` and the other subcommands need none of the exporter's machinery.
    from trainstack.monitoring.exporter.app import Exporter

    logging.basicConfig(level=logging.INFO, format="trainstack exporter: %(message)s")
    config = ExporterConfig(
        host=args.host,
        port=args.port,
        metrics_dir=args.metrics_dir,
        run_dir=args.run_dir,
        pcie_throughput=args.pcie_throughput,
        nvml_module=args.nvml_module,
        sample_interval_seconds=args.sample_interval,
        slow_sample_interval_seconds=args.slow_sample_interval,
        gpm_interval_seconds=args.gpm_interval,
    )
    if config.metrics_dir is not None and not config.metrics_dir.exists():
        log.warning("%s does not exist yet; training metrics appear once a run creates it", config.metrics_dir)
    exporter = Exporter(config)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def launcher_gone(launcher: int) -> None:  # started by `trainstack train`, which is gone: nothing to serve
        log.info("the launcher (PID %d) is gone; stopping", launcher)
        stop.set()

    watch_supervisor(launcher_gone)
    exporter.start()
    # What start-up made lives as long as the process: kept out of the collector's full passes, which otherwise
    # walk it all (10-15 ms each) and stall whichever thread triggers them, a scrape's included.
    gc.freeze()
    session = exporter.session
    nvml = (
        f"NVML up, driver {session.driver_version}, {session.health().gpus} GPU(s), sampled every "
        f"{config.sample_interval_seconds:g} s, slow fields every {config.slow_sample_interval_seconds:g} s"
        if session.up
        else f"NVML down ({session.down_reason})"
    )
    training = f"training metrics from {config.metrics_dir}" if config.metrics_dir else "no --metrics-dir"
    log.info("serving http://%s:%d/metrics (%s; %s)", _url_host(config.host), exporter.server.port, nvml, training)
    stop.wait()
    exporter.stop()
    return EXIT_OK


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack.monitoring.exporter", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ConfigError, RuntimeFailure) as error:
        print(f"trainstack exporter: error: {error}", file=sys.stderr)
        return exit_code(error)
