"""`trainstack` console command: one subcommand per concern, each imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

from train.errors import EXIT_CONFIG, ConfigError

# name -> (module, one-line help). Each module has add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = {
    "train": ("train.launch", "launch the training ranks (one per GPU; 2 CPU ranks without a GPU)"),
    "exporter": ("monitoring.exporter.cli", "serve per-GPU NVML and per-rank training metrics"),
    "doctor": ("train.doctor.cli", "preflight checks: GPUs, CUDA, /dev/shm, ulimits, NCCL switches, ports, disk"),
    "export": ("train.export", "write a checkpoint's full model weights as one safetensors file (DDP or FSDP)"),
    "report": ("monitoring.report.cli", "write RUN_DIR/report.html: loss, throughput, step times, data wait, GPUs"),
    "diagnose": ("monitoring.diagnose.cli", "why a live run leaves GPUs idle: reads its exporter or Prometheus"),
    "bench": ("bench.scaling.cli", "benchmarks: scaling = DDP vs DataParallel samples/s, efficiency on 1..N devices"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainstack", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return importlib.import_module(args._module).run(args)
    except ConfigError as error:
        print(f"trainstack {args.command}: error: {error}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
