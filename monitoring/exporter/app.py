"""The exporter assembled from its parts: NVML session, GPU sampler, collectors, HTTP server, GPU log."""

from __future__ import annotations

import importlib
import os

from prometheus_client import CollectorRegistry

from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring.exporter.config import ExporterConfig
from trainstack.monitoring.exporter.gpu import GpuCollector
from trainstack.monitoring.exporter.gpu_log import GpuLog
from trainstack.monitoring.exporter.hang import HangCollector
from trainstack.monitoring.exporter.health import CollectorRuns, ExporterCollector, Timed
from trainstack.monitoring.exporter.nvml import NvmlSession
from trainstack.monitoring.exporter.sampler import Sampler
from trainstack.monitoring.exporter.server import Endpoints, MetricsServer
from trainstack.monitoring.exporter.training import TrainingCollector
from trainstack.monitoring.exporter.watched import WatchedCommandCollector
from trainstack.rundir import RunDir


def build_sampler(config: ExporterConfig, session: NvmlSession) -> Sampler:
    return Sampler(session, config.sample_interval_seconds, config.slow_sample_interval_seconds)


def build_registry(config: ExporterConfig, sampler: Sampler) -> CollectorRegistry:
    """One registry, collectors registered once; each builds its metric families fresh at every scrape."""
    # auto_describe=False: registering must not run a collection at start-up for nothing.
    registry = CollectorRegistry(auto_describe=False)
    runs = CollectorRuns()
    registry.register(Timed(GpuCollector(sampler), runs))
    registry.register(Timed(TrainingCollector(config.metrics_dir), runs))
    registry.register(Timed(HangCollector(config.run_dir, config.metrics_dir), runs))
    registry.register(Timed(WatchedCommandCollector(config.metrics_dir), runs))
    registry.register(ExporterCollector(sampler.session, runs, sampler))  # last: reports the runs of the two above
    return registry


class Exporter:
    def __init__(self, config: ExporterConfig):
        self.config = config
        try:
            nvml = importlib.import_module(config.nvml_module)
        except ImportError as error:
            raise ConfigError(f"--nvml-module {config.nvml_module!r} cannot be imported ({error})") from None
        self.session = NvmlSession(
            nvml, pcie_throughput=config.pcie_throughput, gpm_interval_seconds=config.gpm_interval_seconds
        )
        self.sampler = build_sampler(config, self.session)
        self.registry = build_registry(config, self.sampler)
        try:
            self.server = MetricsServer(config.host, config.port, Endpoints(self.registry, self.health))
        except (ConfigError, RuntimeFailure):
            self.session.close()
            raise
        self.gpu_log = None
        if config.run_dir is not None and self.session.up:
            self.gpu_log = GpuLog(self.sampler, RunDir(config.run_dir).gpu_log, config.gpu_log_interval_seconds)

    def health(self) -> dict:
        nvml = self.session.health()
        metrics_dir = self.config.metrics_dir
        return {
            "status": "ok",
            "pid": os.getpid(),  # which exporter answered: the launcher's, not another one on a port it reuses
            "nvml": "up" if nvml.up else "down",
            "nvml_down_reason": self.session.down_reason or None,
            "gpus": nvml.gpus,
            "gpus_lost": nvml.gpus_lost,
            "metrics_dir": str(metrics_dir) if metrics_dir else None,
            "metrics_dir_present": bool(metrics_dir and metrics_dir.is_dir()),
        }

    def start(self) -> None:
        self.sampler.start()
        self.server.start()
        if self.gpu_log is not None:
            self.gpu_log.start()

    def stop(self) -> None:
        if self.gpu_log is not None:
            self.gpu_log.stop()
        self.server.stop()
        self.sampler.stop()
        self.session.close()
