"""The plain DDP loop of plain_ddp.py started as PyTorch's DDP tutorial starts its ranks: `torch.multiprocessing.spawn`
from one `python script.py`, each rank passing its rank and the world size to init_process_group, with no RANK
variable and no launcher. tests/timing/test_auto_spawn.py runs it under `trainstack watch` with no trainstack line.

    spawn_ddp.py STEPS PORT
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from plain_ddp import BATCH, HEALTHY, Batches, Model
from torch.nn.parallel import DistributedDataParallel

WORLD_SIZE = 2


def rank_main(rank: int, steps: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for inputs, targets in torch.utils.data.DataLoader(Batches([HEALTHY], steps, BATCH), batch_size=None):
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    steps, port = int(sys.argv[1]), int(sys.argv[2])
    mp.spawn(rank_main, args=(steps, port), nprocs=WORLD_SIZE)
