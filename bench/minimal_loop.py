"""The reference for bench/train_overhead.py and bench/gpu_throughput.py: the shortest correct Accelerate DDP loop
on trainstack's model and data, with nothing else (no telemetry, no loss reduction, no checkpoints, no stop flag).
`--compile --fused-adamw --tf32` make it the hand-tuned loop nanoGPT writes.

Run under `accelerate launch` (or plainly, for one device); rank 0 prints one JSON line: {"steps": N,
"seconds": T} for the timed steps, the device synchronized at both ends of the timing.
"""

import argparse
import json
import time
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

from trainstack.train.rank.data import collate, load_token_data
from trainstack.train.rank.model import BUILTIN_MODELS, GPT


def synchronize(device: torch.device) -> None:
    """The host runs ahead of a GPU: wait for its work, so the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--num-workers", type=int, required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--model", default="tiny-gpt", choices=sorted(BUILTIN_MODELS))
    parser.add_argument("--dataset", default="builtin:sequences", help="as trainstack's --dataset")
    parser.add_argument("--mixed-precision", default="no", choices=("no", "fp16", "bf16"))
    parser.add_argument("--compile", action="store_true", help="model.compile() before prepare")
    parser.add_argument("--fused-adamw", action="store_true")
    parser.add_argument("--tf32", action="store_true", help="fp32 matmuls as TF32")
    args = parser.parse_args()
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    on_gpu = accelerator.device.type == "cuda"
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    set_seed(1234)
    data = load_token_data(args.dataset, "text", args.seq_len, 0.0, 1234, None)
    model = GPT(BUILTIN_MODELS[args.model], data.vocab_size, args.seq_len)
    if args.compile:
        model.compile()
    loader = torch.utils.data.DataLoader(
        data.train,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=partial(collate),
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        pin_memory=on_gpu,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, fused=args.fused_adamw)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step, started = 0, None
    while step < args.steps:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.warmup:
                synchronize(accelerator.device)
                started = time.perf_counter()
            if step == args.steps:
                break
    synchronize(accelerator.device)
    seconds = time.perf_counter() - started
    if accelerator.is_main_process:
        print(json.dumps({"steps": args.steps - args.warmup, "seconds": seconds}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
