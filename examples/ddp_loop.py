"""A plain PyTorch DDP training loop, instrumented with trainstack.monitor: the lines marked `# trainstack` are
all it takes (docs/monitor-your-training.md).

    trainstack watch -- torchrun --nproc-per-node 2 examples/ddp_loop.py
    trainstack watch -- torchrun --nproc-per-node 2 examples/ddp_loop.py --slow-rank 1   # see a straggler named

On GPUs each rank takes its own (NCCL); without one the ranks run on the CPU (gloo).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainstack.monitor  # trainstack


def extra_work(seconds: float, device: torch.device) -> None:
    """Small matmuls until `seconds` have passed: a straggler's real work (a sleep would free its core)."""
    work = torch.randn(64, 64, device=device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--slow-rank",
        type=int,
        default=-1,
        help="this rank does extra work in each forward pass, as a slower rank would",
    )
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    features = torch.randn(8192, 64)
    data = TensorDataset(features, features @ torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    monitor = trainstack.monitor.start(model, optimizer=optimizer)  # trainstack
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in monitor.batches(loader):  # trainstack
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with monitor.forward():  # trainstack
                if rank == args.slow_rank:
                    extra_work(args.slow_seconds, device)
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            monitor.step(samples=len(inputs), loss=loss, epoch=epoch)  # trainstack
            step += 1
            if step == args.steps:
                break
        epoch += 1
    monitor.close()  # trainstack
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
