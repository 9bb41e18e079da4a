"""GPU snapshots for the run report: one JSON line per GPU every few seconds in RUN_DIR/telemetry/gpu.jsonl, from
the sampler's latest snapshot (no NVML call of its own)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from trainstack.monitoring.exporter.sampler import Sampler

FIELDS = ("utilization_ratio", "memory_used_bytes", "memory_total_bytes", "power_watts")


class GpuLog:
    def __init__(self, sampler: Sampler, path: Path, interval_seconds: float):
        self._sampler = sampler
        self._path = path
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="exporter-gpu-log", daemon=True)

    def start(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with self._path.open("a", buffering=1) as out:
            while True:
                now = time.time()
                for sample in self._sampler.snapshot().samples:
                    record = {"time": now, "gpu": sample.index, "uuid": sample.uuid}
                    record |= {name: getattr(sample, name) for name in FIELDS}
                    out.write(json.dumps(record) + "\n")
                if self._stop.wait(self._interval):
                    return
