"""The reference for bench/train_overhead.py: the shortest correct Accelerate DDP loop on trainstack's model
and data, with nothing else (no telemetry, no loss reduction, no checkpoints, no stop flag).

Run under `accelerate launch`; rank 0 prints one JSON line: {"steps": N, "seconds": T} for the timed steps.
"""

import argparse
import json
import time
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

from train.data import collate, load_token_data
from train.model import BUILTIN_MODELS, GPT


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--num-workers", type=int, required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(1234)
    data = load_token_data("builtin:sequences", "text", args.seq_len, 0.0, 1234, None)
    model = GPT(BUILTIN_MODELS["tiny-gpt"], data.vocab_size, args.seq_len)
    loader = torch.utils.data.DataLoader(data.train, batch_size=args.batch_size, shuffle=True,
                                         collate_fn=partial(collate), num_workers=args.num_workers,
                                         persistent_workers=args.num_workers > 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
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
                started = time.perf_counter()
            if step == args.steps:
                break
    seconds = time.perf_counter() - started
    if accelerator.is_main_process:
        print(json.dumps({"steps": args.steps - args.warmup, "seconds": seconds}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
