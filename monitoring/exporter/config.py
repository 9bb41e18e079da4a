"""The exporter's settings: one dataclass, checked when it is built."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.rundir import DEFAULT_EXPORTER_HOST, DEFAULT_EXPORTER_PORT, check_port

DEFAULT_SAMPLE_INTERVAL = 1.0
DEFAULT_SLOW_SAMPLE_INTERVAL = 30.0
DEFAULT_GPM_INTERVAL = 5.0


@dataclass(frozen=True)
class ExporterConfig:
    host: str = DEFAULT_EXPORTER_HOST
    """Address to listen on. 127.0.0.1 keeps the endpoint private to the host; 0.0.0.0 lets Prometheus in."""
    port: int = DEFAULT_EXPORTER_PORT
    """TCP port; 0 picks a free one (the chosen port is printed)."""
    metrics_dir: Path | None = None
    """prometheus_client multiprocess directory the ranks write (`SHOWN.node_metrics`); None serves NVML only."""
    run_dir: Path | None = None
    """Run directory: when set and NVML is up, GPU snapshots go to its `gpu_log` (trainstack/rundir.py)."""
    pcie_throughput: bool = False
    """Export PCIe throughput. Off by default: each of the two NVML calls blocks about 20 ms."""
    nvml_module: str = "pynvml"
    """Module that provides the NVML API. Tests and benchmarks pass `trainstack.monitoring.nvml_fake`."""
    gpu_log_interval_seconds: float = 5.0
    """How often a GPU snapshot is appended to the run directory's GPU log."""
    sample_interval_seconds: float = DEFAULT_SAMPLE_INTERVAL
    """How often the sampler reads NVML's fast part (every GPU metric but the slow ones); scrapes serve the latest."""
    slow_sample_interval_seconds: float = DEFAULT_SLOW_SAMPLE_INTERVAL
    """How often it also reads the slow part (energy, violation time, PCIe replays, ECC, NVLink, power limit, memory
    temperature): ~5 ms of CPU per GPU on an H100 with driver 580, so 30 s keeps 8 GPUs under 0.3% of a core."""
    gpm_interval_seconds: float = DEFAULT_GPM_INTERVAL
    """How often a sample also takes a GPM sample (Hopper and newer: SM, tensor, DRAM activity, link traffic), whose
    pair with the previous one gives the means served until the next: one Prometheus scrape's worth, so a 5-s scrape
    sees every moment once, where a 1-s period would show one second in five at five times the cost."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("--host is empty: give an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
        check_port("--port", self.port, zero_means="for any free port")
        for flag, path in (("--metrics-dir", self.metrics_dir), ("--run-dir", self.run_dir)):
            if path is not None and path.exists() and not path.is_dir():
                raise ConfigError(f"{flag} {path} is a file, not a directory: pass the directory instead")
        if not self.gpu_log_interval_seconds > 0:
            raise ConfigError(f"the GPU log interval must be positive, not {self.gpu_log_interval_seconds}")
        if not self.sample_interval_seconds > 0:
            raise ConfigError(
                f"--sample-interval {self.sample_interval_seconds:g} is not positive: give seconds "
                f"between GPU samples, e.g. {DEFAULT_SAMPLE_INTERVAL:g}"
            )
        if not self.slow_sample_interval_seconds >= self.sample_interval_seconds:
            raise ConfigError(
                f"--slow-sample-interval {self.slow_sample_interval_seconds:g} is shorter than "
                f"--sample-interval {self.sample_interval_seconds:g}: the slow fields are read on a "
                "sample, so give at least the sample interval"
            )
        if not self.gpm_interval_seconds >= self.sample_interval_seconds:
            raise ConfigError(
                f"--gpm-interval {self.gpm_interval_seconds:g} is shorter than --sample-interval "
                f"{self.sample_interval_seconds:g}: GPM samples are taken on a sample, so give at least "
                "the sample interval"
            )
        try:
            found = importlib.util.find_spec(self.nvml_module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(
                f"--nvml-module {self.nvml_module!r} cannot be imported: use pynvml "
                "(from nvidia-ml-py) or the fake, trainstack.monitoring.nvml_fake"
            )
