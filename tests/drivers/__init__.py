"""Ranks for tests that need to look inside a Trainer after it ran: each driver runs under `accelerate launch`."""

from __future__ import annotations

import argparse

from trainstack.train.rank.config import add_arguments, from_sources
from trainstack.train.rank.trainer import Trainer


def run_trainer_from_command_line() -> tuple[Trainer, int, str]:
    """trainstack's training flags plus --probe-dir: the Trainer after its run, its exit code and the probe dir."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--probe-dir", required=True)
    args = parser.parse_args()
    trainer = Trainer(from_sources(args))
    return trainer, trainer.run(), args.probe_dir
