"""`trainstack doctor`: takes exactly the flags of `trainstack train`, so a failing train command line can be
re-run with `doctor` in its place."""

from __future__ import annotations

import argparse

from trainstack.errors import EXIT_CONFIG, EXIT_OK
from trainstack.train.launcher import launch_config
from trainstack.train.launcher.fsdp_units import check_fsdp_units
from trainstack.train.rank import config as train_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    launch_config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from trainstack.train.launcher.doctor import DoctorConfig, has_failures, render_json, render_table, run_checks

    # A Slurm job's derived ports unchecked: the port checks show one in use as a FAIL with the others (a rerun of
    # the doctor beside the job's own launcher, whose exporter holds its port, reports rather than refuses).
    launch = launch_config.LaunchConfig.from_args(args, check_ports=False)
    # Refuses what the trainer refuses (e.g. --strategy fsdp --sync-batchnorm).
    train = train_config.from_sources(args, on_cuda=not launch.use_cpu)
    check_fsdp_units(train)
    config = DoctorConfig.for_run(train, launch)
    results = run_checks(config)
    print(render_json(results) if args.json else render_table(results), flush=True)
    return EXIT_CONFIG if has_failures(results) else EXIT_OK
