"""`trainstack doctor`: takes the same flags as `trainstack train`, so a failing train command line can be
re-run with `doctor` in its place."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from train import config as train_config
from train.errors import EXIT_CONFIG, EXIT_OK


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    launch = parser.add_argument_group("launch options (as for trainstack train)")
    launch.add_argument(
        "--nproc-per-node", type=int, help="ranks on this node (default: one per GPU, 2 on CPU)"
    )
    launch.add_argument("--nnodes", type=int, default=_env_int("NNODES", 1))
    launch.add_argument(
        "--node-rank", type=int, default=_env_int("NODE_RANK", _env_int("JOB_COMPLETION_INDEX", 0))
    )
    launch.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    launch.add_argument("--master-port", type=int, default=_env_int("MASTER_PORT", 29500))
    launch.add_argument("--exporter-host", default="127.0.0.1")
    launch.add_argument("--exporter-port", type=int, default=9450, help="0: no exporter")
    train_config.add_arguments(parser)


def doctor_config_from_args(args: argparse.Namespace):
    from train.doctor.config import DoctorConfig, token_batch_bytes

    run = train_config.from_sources(args)
    return DoctorConfig(
        output_dir=Path(run.output_dir),
        num_workers=run.num_workers,
        keep_checkpoints=run.keep_checkpoints,
        loader_batch_bytes=token_batch_bytes(run.batch_size, run.seq_len),
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        exporter_host=args.exporter_host,
        exporter_port=args.exporter_port,
    )


def run(args: argparse.Namespace) -> int:
    from train.doctor import has_failures, render_json, render_table, run_checks

    results = run_checks(doctor_config_from_args(args))
    print(render_json(results) if args.json else render_table(results))
    sys.stdout.flush()
    return EXIT_CONFIG if has_failures(results) else EXIT_OK
