"""An uninstrumented job: the exporter on the NVML fake with no rank telemetry, and the note it gets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trainstack import catalog
from trainstack.monitoring import nvml_fake
from trainstack.monitoring.diagnose.snapshot import GpuView, Snapshot
from trainstack.monitoring.diagnose.verdicts import uninstrumented
from trainstack.monitoring.exporter.app import Exporter
from trainstack.monitoring.exporter.config import ExporterConfig

PROCESS_MEMORY = catalog.GPU_PROCESS_MEMORY_USED.name


# The note on a job that uses GPUs without rank telemetry and is not a watched run (tests/process/test_watch.py has
# those).
UNINSTRUMENTED = uninstrumented(Snapshot("note", 0.0, [], [GpuView("0", "GPU-0")]))


@contextlib.contextmanager
def fake_exporter(host: str) -> Iterator[str]:
    """The exporter, in this process, on a host of the NVML fake and no metrics directory (no rank telemetry, as for
    an uninstrumented job); yields its /metrics URL."""
    nvml_fake.load(host)
    exporter = Exporter(
        ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            sample_interval_seconds=0.1,
            slow_sample_interval_seconds=0.2,
        )
    )
    exporter.start()
    try:
        yield f"http://127.0.0.1:{exporter.server.port}/metrics"
    finally:
        exporter.stop()
        nvml_fake.load(None)
