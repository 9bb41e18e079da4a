"""Memory per rank, DDP vs FSDP: the same model, data and steps on 2 CPU ranks, once per strategy.

Each run is `trainstack train` as a user runs it. The bytes of parameters, gradients and optimizer state per rank
are the ranks' own gauges (parameter, gradient and optimizer-state bytes, trainstack/catalog.py: the tensors each
rank holds at an optimizer step, its shards under FSDP). The largest process's peak RSS (getrusage over the whole
process tree) is printed beside them: it also counts the PyTorch libraries, activations and the data, which
sharding does not touch. Target (issue 16): FSDP/DDP <= 0.6 for parameters + gradients + optimizer state.

    .venv/bin/python bench/memory_per_rank.py [--model builtin:small-gpt] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from train_run import train_command

from trainstack.rundir import RunDir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the catalog comes from this checkout
from trainstack import catalog  # noqa: E402

ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PYTHONPATH": str(REPO)}
# The gauge of each, by the key trainstack/telemetry/'s training_state_bytes gives it.
STATE = {
    catalog.TRAIN_PARAM_BYTES.name: "param_bytes",
    catalog.TRAIN_GRAD_BYTES.name: "grad_bytes",
    catalog.TRAIN_OPTIMIZER_STATE_BYTES.name: "optimizer_state_bytes",
}
TARGET = 0.6
# Runs a command and prints the peak RSS of the largest process in its tree: RUSAGE_CHILDREN covers every
# descendant that was waited for, and the launcher, Accelerate's agent and torchrun wait for theirs.
PEAK_RSS = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(code)"
)
MiB = 1 << 20


def train(args: argparse.Namespace, strategy: str, run_dir: Path) -> int:
    flags = ["--strategy", strategy, "--model", args.model, "--seq-len", str(args.seq_len), "--log-every", "1"]
    flags += ["--eval-fraction", "0", "--exporter-port", "0", "--no-report", "--cpu", "--nproc-per-node", "2"]
    command = train_command(run_dir, args.steps, args.batch_size, 0, flags)
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *command], cwd=REPO, env=ENV, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"--strategy {strategy} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return int(result.stdout.strip().splitlines()[-1])


def gauges(run_dir: Path) -> dict[str, dict[str, float]]:
    """rank -> gauge key -> value, read from the run's prometheus_client files as the exporter reads them."""
    from trainstack.metric_files import merged_metrics

    values: dict[str, dict[str, float]] = {}
    for family in merged_metrics(RunDir(run_dir).node_metrics(0)):
        for sample in family.samples:
            if sample.name in STATE:
                values.setdefault(sample.labels["rank"], {})[STATE[sample.name]] = sample.value
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:small-gpt")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    measured, rss = {}, {}
    with tempfile.TemporaryDirectory(prefix="memory-per-rank-") as tmp:
        for strategy in ("ddp", "fsdp"):
            rss[strategy] = train(args, strategy, Path(tmp) / strategy)
            measured[strategy] = gauges(Path(tmp) / strategy)
    print(f"{args.model}, 2 CPU ranks, {args.steps} steps, batch {args.batch_size} x {args.seq_len} tokens")
    print(f"{'rank':<6}{'bytes of':<18}{'DDP MiB':>10}{'FSDP MiB':>10}{'FSDP/DDP':>10}")
    ratios = []
    for rank in sorted(measured["ddp"]):
        ddp, fsdp = measured["ddp"][rank], measured["fsdp"][rank]
        for key in (*STATE.values(), "total"):
            ddp_bytes = sum(ddp.values()) if key == "total" else ddp[key]
            fsdp_bytes = sum(fsdp.values()) if key == "total" else fsdp[key]
            print(
                f"{rank:<6}{key.removesuffix('_bytes'):<18}{ddp_bytes / MiB:>10.1f}{fsdp_bytes / MiB:>10.1f}"
                f"{fsdp_bytes / ddp_bytes:>10.3f}"
            )
        ratios.append(sum(fsdp.values()) / sum(ddp.values()))
    print(
        f"{'any':<6}{'peak RSS':<18}{rss['ddp'] / MiB:>10.1f}{rss['fsdp'] / MiB:>10.1f}"
        f"{rss['fsdp'] / rss['ddp']:>10.3f}   (largest process; includes libraries and activations)"
    )
    worst = max(ratios)
    print(
        f"params + grads + optimizer state, FSDP/DDP per rank: worst {worst:.3f} (target <= {TARGET}): "
        f"{'met' if worst <= TARGET else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
