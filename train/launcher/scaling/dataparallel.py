"""nn.DataParallel for the scaling comparison: one process drives N GPUs, splitting each batch across them.

Run as a script by the benchmark (a fresh process per device count); prints {"samples_per_second": x}. The
model, data and training flags are `trainstack train`'s, built by the same functions, so only the parallelism
differs. DataParallel at its best: each replica computes its own loss, so only N scalars are gathered to GPU 0
(gathering logits and computing the loss there is slower still). `--gpus 0` runs the same loop on the CPU,
unsplit: a smoke test of this script on hosts without a GPU."""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from torch import nn

from trainstack.train.rank import config as train_config
from trainstack.train.rank.data import collate, load_token_data
from trainstack.train.rank.model import build_model, loss_of


class LossPerReplica(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **batch) -> torch.Tensor:
        return loss_of(self.model(**batch)).reshape(1)  # a 1-element vector: DataParallel gathers it without a warning


def samples_per_second(config: train_config.TrainConfig, gpus: int) -> float:
    torch.manual_seed(config.seed)
    data = load_token_data(config.dataset, config.text_field, config.seq_len, config.eval_fraction, config.seed, config)
    device = "cuda" if gpus else "cpu"
    model = build_model(config, data.vocab_size).to(device)
    parallel = nn.DataParallel(LossPerReplica(model), device_ids=list(range(gpus)) or None)
    loader = torch.utils.data.DataLoader(
        data.train,
        batch_size=config.batch_size * max(gpus, 1),
        shuffle=True,
        drop_last=True,
        pin_memory=bool(gpus),
        collate_fn=partial(collate, pad_to_multiple_of=8),
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    precision = {"no": None, "fp16": torch.float16, "bf16": torch.bfloat16}[config.mixed_precision]
    scaler = torch.amp.GradScaler(device, enabled=precision is torch.float16)
    steps = samples = 0
    started = time.perf_counter()
    while steps < config.max_steps:
        for batch in loader:
            batch = {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
            with torch.autocast(device, dtype=precision or torch.float32, enabled=precision is not None):
                loss = parallel(**batch).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            samples += batch["input_ids"].shape[0]
            if steps == config.max_steps:
                break
    if gpus:
        torch.cuda.synchronize()  # kernels run asynchronously: the clock stops when the last one has finished
    return samples / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, required=True)
    train_config.add_arguments(parser)
    args = parser.parse_args()
    print(json.dumps({"samples_per_second": samples_per_second(train_config.from_sources(args), args.gpus)}))


if __name__ == "__main__":
    main()
