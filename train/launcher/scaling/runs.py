"""One measurement per (mode, device count): DDP through `trainstack train`, DataParallel through
dataparallel.py, each in a fresh process so that no CUDA or process-group state carries over."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainstack.rundir import RunDir, read_summary
from trainstack.train.launcher.scaling.config import ScalingConfig

DATAPARALLEL_SCRIPT = Path(__file__).with_name("dataparallel.py")


@dataclass(frozen=True)
class Measurement:
    mode: str
    devices: int
    samples_per_second: float


class RunFailed(Exception):
    """A benchmark run exited non-zero; the message names its log."""


def _run(command: list[str], log: Path, what: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as output:
        returncode = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT).returncode
    if returncode != 0:
        raise RunFailed(f"{what} exited {returncode}; its output is in {log}")


def run_ddp(config: ScalingConfig, devices: int) -> Measurement:
    run_dir = config.output_dir / f"ddp-{devices}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: never resume a previous benchmark's checkpoint
    _run([sys.executable, "-m", "trainstack", "train", "--output-dir", str(run_dir), "--nproc-per-node",
          str(devices), "--exporter-port", "0", "--checkpoint-every", "0", "--resume", "never",
          *config.training_flags], config.output_dir / f"ddp-{devices}.log", f"DDP on {devices} device(s)")
    summary = read_summary(RunDir(run_dir).summary)
    return Measurement("DDP", devices, summary["samples_per_second"])


def run_dataparallel(config: ScalingConfig, devices: int) -> Measurement:
    log = config.output_dir / f"dataparallel-{devices}.log"
    _run([sys.executable, str(DATAPARALLEL_SCRIPT), "--gpus", str(devices), *config.training_flags], log,
         f"DataParallel on {devices} GPU(s)")
    result = json.loads(log.read_text().strip().splitlines()[-1])
    return Measurement("DataParallel", devices, result["samples_per_second"])


def run_all(config: ScalingConfig, progress) -> list[Measurement]:
    """DDP on every device count; DataParallel too where there are GPUs (it drives CUDA devices only)."""
    modes = [run_ddp] + ([run_dataparallel] if config.gpus else [])
    measurements = []
    for mode in modes:
        for devices in config.devices:
            measurement = mode(config, devices)
            progress(measurement)
            measurements.append(measurement)
    return measurements
