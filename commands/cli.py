"""`trainstack` console command: one subcommand per concern. Only the subcommand that runs is imported (its help
too), so `trainstack --help`, `diagnose`, `exporter` and `report` start without torch."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import NamedTuple, NoReturn

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


class Subcommand(NamedTuple):
    """`module` has add_arguments(parser) and run(args) -> int."""

    module: str
    help: str


SUBCOMMANDS = {
    "train": Subcommand(
        "trainstack.commands.train", "launch the training ranks (one per GPU; 2 CPU ranks without a GPU)"
    ),
    "watch": Subcommand(
        "trainstack.commands.watch",
        "run any training command (python, torchrun, accelerate launch) with the exporter, a run "
        "directory and a report beside it",
    ),
    "exporter": Subcommand("trainstack.monitoring.exporter.cli", "serve per-GPU NVML and per-rank training metrics"),
    "doctor": Subcommand(
        "trainstack.train.launcher.doctor.cli",
        "preflight checks: GPUs, CUDA, /dev/shm, ulimits, NCCL switches, ports, disk",
    ),
    "export": Subcommand(
        "trainstack.train.launcher.export",
        "write a checkpoint's full model weights as one safetensors file (DDP or FSDP)",
    ),
    "report": Subcommand(
        "trainstack.monitoring.report.cli", f"write {SHOWN.report}: loss, throughput, step times, data wait, GPUs"
    ),
    "diagnose": Subcommand(
        "trainstack.monitoring.diagnose.cli", "why a live run leaves GPUs idle: reads its exporter or Prometheus"
    ),
    "compare": Subcommand(
        "trainstack.monitoring.compare.cli",
        "two run directories side by side: throughput, goodput, time breakdown, verdicts, settings",
    ),
    "tune": Subcommand(
        "trainstack.commands.tune.cli",
        "short trials of the fixes the diagnosis names, against the baseline; writes the fastest as a config file",
    ),
    "bench": Subcommand(
        "trainstack.train.launcher.scaling.cli",
        "benchmarks: scaling = DDP vs DataParallel samples/s, efficiency on 1..N devices",
    ),
}
EXIT_CODES = f"""exit codes (docs/training.md): {EXIT_OK} done; {EXIT_FAILED} failed (a rank crashed or timed out; \
diagnose: a problem found); {EXIT_CONFIG} bad input or a failed preflight check (retrying cannot help); \
{EXIT_RUNTIME} a network, listen or I/O failure (retrying may help); {EXIT_PREEMPTED} stopped by SIGTERM after \
saving a checkpoint (rerun to resume). watch exits with its command's code (128+N for signal N); these codes only \
for its own failures"""


def overview_parser() -> argparse.ArgumentParser:
    """`trainstack --help`: the subcommands and what each does, from the table above (nothing imported)."""
    parser = argparse.ArgumentParser(prog="trainstack", description=__doc__, epilog=EXIT_CODES)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, subcommand in SUBCOMMANDS.items():
        commands.add_parser(name, help=subcommand.help, add_help=False)
    return parser


class OneLineErrors(argparse.ArgumentParser):
    """A flag argparse refuses (a typo, a value of the wrong type) is one line naming it and where the options are,
    not the whole usage above it (`trainstack train`'s runs to 40 lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    subcommand = SUBCOMMANDS[name]
    parser = OneLineErrors(prog=f"trainstack {name}", description=subcommand.help, epilog=EXIT_CODES)
    module = importlib.import_module(subcommand.module)
    module.add_arguments(parser)
    parser.set_defaults(command=name, _run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:  # the reader went away (`... --json | head`): as a program SIGPIPE ends, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is in place (its imports), or in one without
        print(file=sys.stderr)  # the terminal's ^C is left mid-line
        return 128 + signal.SIGINT


def _main(argv: list[str]) -> int:
    if not argv or argv[0] not in SUBCOMMANDS:
        overview_parser().parse_args(argv)  # prints the overview, or names the unknown command; exits
        return EXIT_CONFIG
    args = subcommand_parser(argv[0]).parse_args(argv[1:])
    try:
        return args._run(args)
    except (ConfigError, RuntimeFailure) as error:
        print(f"trainstack {args.command}: error: {error}", file=sys.stderr)
        return exit_code(error)
