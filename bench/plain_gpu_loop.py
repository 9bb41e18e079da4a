"""A plain DDP loop on one CUDA GPU with no trainstack line: a 6-layer transformer language model (width 768, 16 x
512 tokens a step) in bf16 on one NCCL rank, fed by a DataLoader of token batches copied without blocking.
bench/auto_instrument_overhead.py --gpu measures what `trainstack watch`'s automatic instrumentation costs it;
tests/process/test_gpu_watch.py has watch judge it.

    torchrun --nproc-per-node 1 plain_gpu_loop.py MODE STEPS [OUT]

MODE: healthy, or slow-loader (each batch waits SLOW_LOADER_SECONDS in the loader, longer than a step: input-bound).
OUT: rank 0 writes its steps/s and its loop thread's and whole process's CPU time per step after the warm-up, as
JSON.
"""

import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

VOCAB, WIDTH, LAYERS, HEADS = 32768, 768, 6, 12
BATCH, SEQ = 16, 512
WARM_UP = 20
SLOW_LOADER_SECONDS = 0.05


class Tokens(torch.utils.data.Dataset):
    """Each item a whole batch (the DataLoader's batch_size=None): the same one, made once."""

    def __init__(self, steps: int, delay: float):
        self.tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
        self.steps, self.delay = steps, delay

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.tokens


class LanguageModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        block = torch.nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(block, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(self.embed(tokens), mask=causal, is_causal=True))


def main() -> None:
    mode, steps = sys.argv[1], int(sys.argv[2])
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    dist.init_process_group("nccl")
    device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = DistributedDataParallel(LanguageModel().to(device), device_ids=[device.index])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    delay = SLOW_LOADER_SECONDS if mode == "slow-loader" else 0.0
    loader = torch.utils.data.DataLoader(Tokens(steps + WARM_UP, delay), batch_size=None, pin_memory=True)
    started = cpu_started = process_started = 0.0
    faults_before = 0
    for step, tokens in enumerate(loader):
        if step == WARM_UP:
            torch.cuda.synchronize()
            started, cpu_started, process_started = time.perf_counter(), time.thread_time(), time.process_time()
            faults_before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        tokens = tokens.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if out is not None and dist.get_rank() == 0:
        seconds = time.perf_counter() - started
        cpu_ms = (time.thread_time() - cpu_started) * 1000 / steps
        process_ms = (time.process_time() - process_started) * 1000 / steps
        faults = (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults_before) / steps
        result = {
            "steps_per_second": steps / seconds,
            "cpu_ms_per_step": cpu_ms,
            "process_ms_per_step": process_ms,
            "faults_per_step": faults,
        }
        out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
