"""One `trainstack train` run of a benchmark: a short run in a scratch directory, no periodic checkpoint, started
at once (pinned to some CPUs when run side by side, bench/side_by_side.py) and waited for later, so that two runs
can train at the same time. `train_command` is its command line, for a benchmark that starts and reads the run
itself."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import pinned

from trainstack.rundir import RunDir, read_summary

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}


def train_command(run_dir: Path, steps: int, batch_size: int, num_workers: int, flags: list[str]) -> list[str]:
    """`trainstack train` into run_dir for `steps` steps, with no periodic checkpoint and nothing resumed, so that
    each run of a benchmark trains the same steps; `flags`: the run's own, after these."""
    return [
        sys.executable,
        "-m",
        "trainstack",
        "train",
        "--output-dir",
        str(run_dir),
        "--max-steps",
        str(steps),
        "--batch-size",
        str(batch_size),
        "--num-workers",
        str(num_workers),
        "--checkpoint-every",
        "0",
        "--resume",
        "never",
        *flags,
    ]


class TrainRun:
    def __init__(
        self,
        steps: int,
        batch_size: int,
        num_workers: int,
        flags: list[str],
        env: dict[str, str],
        cpus: set[int] | None = None,
    ):
        """`flags`: the run's own, after the shared ones; `env`: set on top of the offline environment."""
        self._tmp = tempfile.TemporaryDirectory(prefix="trainstack-bench-")
        self.run_dir = Path(self._tmp.name) / "run"
        command = train_command(self.run_dir, steps, batch_size, num_workers, flags)
        self.process = subprocess.Popen(
            pinned(command, cpus) if cpus else command,
            cwd=REPO,
            env={**ENV, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def summary(self) -> dict:
        """Waits for the run; its summary.json. A failed run ends the benchmark with its stderr's tail."""
        stderr = self.process.communicate()[1]
        try:
            if self.process.returncode != 0:
                sys.exit(f"training run failed (exit {self.process.returncode}):\n{stderr[-4000:]}")
            return read_summary(RunDir(self.run_dir).summary)
        finally:
            self._tmp.cleanup()
