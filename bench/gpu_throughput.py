"""trainstack against the best hand-written loop on one GPU: the GPT-2-small shape at seq 1024 in bf16 (issue 13).

One run, one after the other on the same GPU, the same model (`builtin:gpt2-small`), data and batch:

1. the minimal Accelerate loop (bench/minimal_loop.py), eager: what a user writes first;
2. the same loop with `model.compile()`, fused AdamW and TF32: what nanoGPT writes;
3. `trainstack train` with its GPU defaults (bf16, fused AdamW, TF32), as users run it;
4. `trainstack train --compile`.

The data is byte text this script writes, every line longer than --seq-len, so every batch is full length (one
shape: nothing recompiles mid-run). Each is timed over --steps steps after --warmup steps, compilation inside the
warm-up, with the GPU synchronized at both ends: the minimal loop calls torch.cuda.synchronize(); for trainstack
the clock is the `time` of its own telemetry records at those two steps, taken when the GPU has just run the
step (the record waits on the step's CUDA event). MFU = model FLOPs per token (GPT.flops_per_token: 6N + 12 x
layers x width x seq, N without the position embedding) x tokens/s / the GPU's dense bf16 peak
(trainstack/telemetry/).

    python bench/gpu_throughput.py [--batch-size 64] [--warmup 30] [--steps 120] [--json gpu_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_run import train_command

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: trainstack and the report's record reader come from the checkout
from trainstack import record  # noqa: E402
from trainstack.rundir import RunDir, read_summary  # noqa: E402

ENV = {
    **os.environ,
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TQDM_DISABLE": "1",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}
MODEL = "gpt2-small"
EVAL_FRACTION = 0.01


def write_text(path: Path, lines: int, seq_len: int) -> None:
    """Random words; every line at least seq_len + 64 bytes, so byte tokenization truncates each to seq_len."""
    rng = random.Random(1234)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    with path.open("w") as out:
        for _ in range(lines):
            line = []
            while sum(len(word) + 1 for word in line) < seq_len + 64:
                line.append(rng.choice(words))
            out.write(" ".join(line) + "\n")


def minimal(args: argparse.Namespace, data: Path, tuned: bool) -> dict:
    command = [
        sys.executable,
        "bench/minimal_loop.py",
        "--steps",
        str(args.warmup + args.steps),
        "--warmup",
        str(args.warmup),
        "--batch-size",
        str(args.batch_size),
        "--num-workers",
        str(args.num_workers),
        "--seq-len",
        str(args.seq_len),
        "--model",
        MODEL,
        "--dataset",
        str(data),
        "--mixed-precision",
        "bf16",
    ]
    if tuned:
        command += ["--compile", "--fused-adamw", "--tf32"]
    stdout = run(command, "the minimal loop")
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    return {"steps_per_second": result["steps"] / result["seconds"]}


def trainstack(args: argparse.Namespace, data: Path, run_dir: Path, compile_: bool) -> dict:
    flags = ["--model", f"builtin:{MODEL}", "--dataset", str(data), "--seq-len", str(args.seq_len), "--log-every", "10"]
    flags += ["--eval-fraction", str(EVAL_FRACTION), "--exporter-port", "0", "--no-report"]
    if compile_:
        flags.append("--compile")
    command = train_command(run_dir, args.warmup + args.steps, args.batch_size, args.num_workers, flags)
    run(command, "trainstack train")
    records = {r.step: r for r in record.records(record.read_launches(RunDir(run_dir).rank_records(0)))}
    first, last = records[args.warmup], records[args.warmup + args.steps]
    timed = [r for step, r in records.items() if step > args.warmup]
    full = sum(r.tokens for r in timed) == args.steps * args.batch_size * args.seq_len
    summary = read_summary(RunDir(run_dir).summary)
    return {
        "steps_per_second": args.steps / (last.time - first.time),
        "full_length_batches": full,
        "mixed_precision": summary["mixed_precision"],
        "compile_seconds": summary.get("compile_seconds"),
        "recompiles": summary.get("recompiles"),
    }


def run(command: list[str], what: str) -> str:
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{what} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    print(f"  {what}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=30, help="steps left out of the timing (a multiple of 10)")
    parser.add_argument("--steps", type=int, default=120, help="timed steps (a multiple of 10)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("gpu_throughput.json"), help="where to write the results")
    args = parser.parse_args()
    if args.warmup % 10 or args.steps % 10 or args.warmup < 10:
        sys.exit("--warmup and --steps must be multiples of 10 (trainstack's telemetry records every 10 steps)")
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gpu_throughput.py needs a CUDA GPU; on CPU use bench/train_overhead.py")
    from trainstack.telemetry.device import peak_flops
    from trainstack.train.rank.model import BUILTIN_MODELS, GPT

    device = torch.device("cuda")
    flops_per_token = GPT(BUILTIN_MODELS[MODEL], 256, args.seq_len).flops_per_token(args.seq_len)
    peak = peak_flops(device, "bf16")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        data = Path(tmp) / "text.txt"
        # Enough lines that no loop reaches the end of an epoch (a short last batch would be a new shape).
        write_text(data, int((args.warmup + args.steps + 10) * args.batch_size / (1 - EVAL_FRACTION)) + 1, args.seq_len)
        rows["minimal loop, eager"] = minimal(args, data, tuned=False)
        rows["minimal loop, compile + fused AdamW + TF32"] = minimal(args, data, tuned=True)
        rows["trainstack train (GPU defaults)"] = trainstack(args, data, Path(tmp) / "default", compile_=False)
        rows["trainstack train --compile"] = trainstack(args, data, Path(tmp) / "compile", compile_=True)
    best = max(rows[name]["steps_per_second"] for name in rows if name.startswith("minimal"))
    for row in rows.values():
        row["tokens_per_second"] = row["steps_per_second"] * args.batch_size * args.seq_len
        row["mfu"] = flops_per_token * row["tokens_per_second"] / peak if peak else None
        row["ratio_to_best_minimal"] = row["steps_per_second"] / best
    name = torch.cuda.get_device_name(device)
    print(
        f"{name}, {MODEL}, seq {args.seq_len}, batch {args.batch_size}, bf16, {args.steps} steps timed after "
        f"{args.warmup}; MFU against {peak / 1e12 if peak else float('nan'):.1f} TFLOP/s"
    )
    print("| loop | steps/s | tokens/s | MFU | x best minimal |\n| --- | --- | --- | --- | --- |")
    for label, row in rows.items():
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
        print(
            f"| {label} | {row['steps_per_second']:.2f} | {row['tokens_per_second'] / 1e3:,.0f}K | {mfu} | "
            f"{row['ratio_to_best_minimal']:.3f} |"
        )
    args.json.write_text(
        json.dumps(
            {
                "device": name,
                "model": MODEL,
                "seq_len": args.seq_len,
                "batch_size": args.batch_size,
                "warmup": args.warmup,
                "steps": args.steps,
                "flops_per_token": flops_per_token,
                "peak_flops": peak,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
