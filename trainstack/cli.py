"""`trainstack` console command: one subcommand per concern, each imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

from trainstack.errors import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RUNTIME,
    ConfigError,
    RuntimeFailure,
    exit_code,
)
from trainstack.rundir import SHOWN

# name -> (module, one-line help). Each module has add_arguments(parser) and run(args) -> int, except `train`:
# its flags are the launcher's configuration (train/launch_config.py), and run_train below runs the launcher
# (train/) and then the run report (monitoring/), which train/ does not import.
SUBCOMMANDS = {
    "train": ("train.launch_config", "launch the training ranks (one per GPU; 2 CPU ranks without a GPU)"),
    "exporter": ("monitoring.exporter.cli", "serve per-GPU NVML and per-rank training metrics"),
    "doctor": ("train.doctor.cli", "preflight checks: GPUs, CUDA, /dev/shm, ulimits, NCCL switches, ports, disk"),
    "export": ("train.export", "write a checkpoint's full model weights as one safetensors file (DDP or FSDP)"),
    "report": ("monitoring.report.cli", f"write {SHOWN.report}: loss, throughput, step times, data wait, GPUs"),
    "diagnose": ("monitoring.diagnose.cli", "why a live run leaves GPUs idle: reads its exporter or Prometheus"),
    "bench": ("bench.scaling.cli", "benchmarks: scaling = DDP vs DataParallel samples/s, efficiency on 1..N devices"),
}
EXIT_CODES = f"""exit codes (docs/training.md): {EXIT_OK} done; {EXIT_FAILED} failed (a rank crashed or timed out; \
diagnose: a problem found); {EXIT_CONFIG} bad input or a failed preflight check (retrying cannot help); \
{EXIT_RUNTIME} a network, listen or I/O failure (retrying may help); {EXIT_PREEMPTED} stopped by SIGTERM after \
saving a checkpoint (rerun to resume)"""


def run_train(args: argparse.Namespace) -> int:
    """The launcher, then the run report, written while the launcher still holds the run directory."""
    from monitoring.report import write_report
    from train import launch

    return launch.run(args, write_report_with=write_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainstack", description=__doc__, epilog=EXIT_CODES)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES)
        module = importlib.import_module(module_name)
        sub.set_defaults(_run=run_train if name == "train" else module.run)
        module.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args._run(args)
    except (ConfigError, RuntimeFailure) as error:
        print(f"trainstack {args.command}: error: {error}", file=sys.stderr)
        return exit_code(error)
