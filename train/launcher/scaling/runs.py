"""One measurement per (mode, device count): DDP through `trainstack train`, DataParallel through
dataparallel.py, each in a fresh process so that no CUDA or process-group state carries over."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainstack import window
from trainstack.rundir import RunDir, read_summary
from trainstack.train.launcher.scaling.config import ScalingConfig

DATAPARALLEL_SCRIPT = Path(__file__).with_name("dataparallel.py")


@dataclass(frozen=True)
class Measurement:
    mode: str
    devices: int
    samples_per_second: float
    exposed_comm_share: float | None = None
    """The least exposed rank's share of its step time spent waiting for communication compute did not hide
    (ratios.COMM_EXPOSED_SHARE over the run); None where nothing measured it: one device, DataParallel."""


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
    _run(
        [
            sys.executable,
            "-m",
            "trainstack",
            "train",
            "--output-dir",
            str(run_dir),
            "--nproc-per-node",
            str(devices),
            "--exporter-port",
            "0",
            "--checkpoint-every",
            "0",
            "--resume",
            "never",
            *config.training_flags,
        ],
        config.output_dir / f"ddp-{devices}.log",
        f"DDP on {devices} device(s)",
    )
    throughput = read_summary(RunDir(run_dir).summary)["samples_per_second"]
    assert throughput is not None, "a launch that exited 0 wrote its throughput"
    return Measurement("DDP", devices, throughput, exposed_comm_share(run_dir))


def exposed_comm_share(run_dir: Path) -> float | None:
    """From the ranks' steady windows (trainstack/record.py), as the comm-bound verdict judges a job: its least
    exposed rank, of the ranks that measured communication."""
    shares = [share for steady in window.of_run(run_dir) if (share := steady.comm_exposed_ratio) is not None]
    return min(shares, default=None)


def run_dataparallel(config: ScalingConfig, devices: int) -> Measurement:
    log = config.output_dir / f"dataparallel-{devices}.log"
    _run(
        [sys.executable, str(DATAPARALLEL_SCRIPT), "--gpus", str(devices), *config.training_flags],
        log,
        f"DataParallel on {devices} GPU(s)",
    )
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
