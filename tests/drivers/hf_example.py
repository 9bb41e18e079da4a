"""examples/hf_trainer.py, as the tests run it: loaded from its file (examples/ is no package), and as a rank under
torchrun whose collator slows down on cue, so that the ranks come to wait for their input, or whose rank 1 does real
extra work after each optimizer step, so that rank 0 comes to wait for it.

    torchrun ... -m tests.drivers.hf_example --slow-down-when PATH --delay SECONDS [the example's own flags]
    torchrun ... -m tests.drivers.hf_example --slow-down-when PATH --delay 0 --rank-1-after-step SECONDS [...]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType

import torch
from transformers import TrainerCallback

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-down-when", type=Path, required=True, help="once this file exists, batches are slow")
    parser.add_argument("--delay", type=float, required=True, help="seconds each slow batch takes longer to make")
    parser.add_argument(
        "--rank-1-after-step", type=float, default=0.0, help="seconds of compute rank 1 adds after each optimizer step"
    )
    options, example_args = parser.parse_known_args()
    example = load_example()
    collate = example.collate

    def collate_slowing_down(samples):
        if options.slow_down_when.exists():
            time.sleep(options.delay)
        return collate(samples)

    example.collate = collate_slowing_down  # what build_trainer hands the Trainer
    if options.rank_1_after_step and os.environ.get("RANK") == "1":
        build_trainer = example.build_trainer

        def build_slowed_trainer(args):
            trainer = build_trainer(args)
            trainer.add_callback(SlowAfterOptimizerStep(options.rank_1_after_step))
            return trainer

        example.build_trainer = build_slowed_trainer
    example.main(example_args)


class SlowAfterOptimizerStep(TrainerCallback):
    """Works right after the optimizer's step (`on_optimizer_step`, before `on_step_end`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_optimizer_step(self, args, state, control, **kwargs) -> None:
        busy(self.seconds)


def busy(seconds: float) -> None:
    """Small matmuls until `seconds` have passed: a slower rank's own work (a sleep would free its core)."""
    work = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


if __name__ == "__main__":
    main()
