"""`trainstack bench scaling`: run the scaling benchmark and print its table; writes scaling.json and
scaling.png into --output-dir."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainstack.errors import EXIT_FAILED, EXIT_OK


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of device counts") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`trainstack bench BENCHMARK`: scaling is the one benchmark with a subcommand (make bench runs the rest)."""
    parser.add_argument(
        "benchmark", choices=("scaling",), help="scaling: DDP (and DataParallel on GPUs) on 1..N devices"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("runs/bench-scaling"),
        help="where the runs, scaling.json and scaling.png go (default runs/bench-scaling)",
    )
    parser.add_argument(
        "--devices",
        type=_counts,
        default=(),
        help="device counts, e.g. 1,2,4,8 (default: 1, 2, 4... and all GPUs; 1,2 CPU ranks)",
    )
    parser.add_argument("--max-steps", type=int, default=100, help="optimizer steps per run (default 100)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per device per step (default 16)")
    parser.add_argument("--model", default="builtin:tiny-gpt")
    parser.add_argument("--dataset", default="builtin:sequences")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--num-workers", type=int, default=2, help="loader workers per rank (default 2)")
    parser.add_argument("--mixed-precision", choices=("no", "fp16", "bf16"), default="no")
    parser.add_argument(
        "--predict",
        type=Path,
        metavar="RUN_DIR",
        help="run nothing: predict RUN_DIR's step time and efficiency at other world sizes and link "
        "speeds from its own figures (train/launcher/scaling/predict.py states the model)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        metavar="GBIT_S",
        help="with --predict: the link's bus bandwidth in Gbit/s (default: what the run achieved)",
    )
    parser.add_argument(
        "--world-sizes",
        type=_counts,
        default=(2, 4, 8, 16),
        help="with --predict: world sizes to predict (default 2,4,8,16)",
    )


def run(args: argparse.Namespace) -> int:
    if args.predict:
        return _predict(args)
    import torch

    from trainstack.train.launcher.scaling import results
    from trainstack.train.launcher.scaling.config import ScalingConfig
    from trainstack.train.launcher.scaling.runs import RunFailed, run_all

    config = ScalingConfig(
        gpus=torch.cuda.device_count(),
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        model=args.model,
        dataset=args.dataset,
        seq_len=args.seq_len,
        num_workers=args.num_workers,
        mixed_precision=args.mixed_precision,
        devices=args.devices,
    )
    config.output_dir.mkdir(parents=True, exist_ok=True)

    def progress(measurement) -> None:
        print(
            f"bench scaling: {measurement.mode} on {measurement.devices}: "
            f"{measurement.samples_per_second:.1f} samples/s",
            file=sys.stderr,
            flush=True,
        )

    try:
        measurements = run_all(config, progress)
    except RunFailed as error:
        print(f"trainstack bench: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    results.write_json(measurements, config.gpus, config.output_dir / "scaling.json")
    results.plot(measurements, config.gpus, config.output_dir / "scaling.png")
    print(results.table(measurements, config.gpus))
    print(f"results: {config.output_dir / 'scaling.json'}, plot: {config.output_dir / 'scaling.png'}")
    return EXIT_OK


def _predict(args: argparse.Namespace) -> int:
    from trainstack.errors import ConfigError
    from trainstack.train.launcher.scaling import predict

    if args.bandwidth is not None and not args.bandwidth > 0:
        raise ConfigError(f"--bandwidth must be positive Gbit/s, got {args.bandwidth}")
    if min(args.world_sizes) < 1:
        raise ConfigError(f"--world-sizes must be positive counts, got {','.join(map(str, args.world_sizes))}")
    run = predict.figures_of(args.predict)
    bandwidth = args.bandwidth * 1e9 / 8 if args.bandwidth else None
    predictions = [predict.predict(run, size, bandwidth) for size in args.world_sizes]
    print(predict.table(run, predictions, given=bandwidth is not None))
    return EXIT_OK
