"""A plain 2-rank loop (gloo) instrumented with trainstack.monitor that hangs on purpose at step 5, for
tests/process/test_hang.py: `--hang skip-collective` (rank 0 alone calls an all_reduce under `if rank == 0:`; rank 1
goes on to work that needs no peer), `--hang skip-first-collective` (the same before the first step), `--hang loader`
(rank 1's dataset never returns its batch), `--hang none` (healthy: runs `--steps` and exits)."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import trainstack.monitor

HANG_STEP = 5


class Batches(Dataset):
    def __init__(self, rank: int, stuck: bool):
        self.rank, self.stuck = rank, stuck

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.stuck and self.rank == 1 and index == HANG_STEP:
            time.sleep(3600)  # a read from a file system that never answers
        return torch.ones(8)


def own_evaluation() -> None:
    time.sleep(3600)  # rank 1's work that needs no peer, while rank 0 waits for it in a collective


def skip_a_collective_on_rank_1(rank: int, device: torch.device) -> None:
    if rank == 0:
        dist.all_reduce(torch.zeros(1, device=device))  # the collective only rank 0 calls
    else:
        own_evaluation()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--hang", choices=["none", "skip-collective", "skip-first-collective", "loader"], default="none"
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device("cuda", rank) if args.backend == "nccl" else torch.device("cpu")
    model = torch.nn.Linear(8, 1).to(device)
    monitor = trainstack.monitor.start(model)
    loader = DataLoader(Batches(rank, args.hang == "loader"), batch_size=None, shuffle=False)
    if args.hang == "skip-first-collective":
        skip_a_collective_on_rank_1(rank, device)
    for step, batch in enumerate(monitor.batches(loader)):
        if step == args.steps:
            break
        with monitor.forward():
            loss = model(batch.to(device)).sum()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        monitor.step(samples=1, loss=loss)
        time.sleep(0.02)
        if step == HANG_STEP and args.hang == "skip-collective":
            skip_a_collective_on_rank_1(rank, device)
    monitor.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
