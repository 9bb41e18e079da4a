"""A plain DDP loop with no trainstack line (unless asked): a BatchNorm model on CPU ranks over gloo, fed by a
DataLoader; after it an evaluation and checkpoints (torch.save on rank 0; in the healthy mode
torch.distributed.checkpoint's on every rank too). tests/process/test_auto_instrument.py runs it under
`trainstack watch -- torchrun ...`, where the automatic instrumentation (trainstack/auto/) must see it.

    plain_ddp.py MODE [STEPS]

MODE: healthy; slow-loader (every batch waits in __getitem__); slow-forward (rank 1 computes more in its forward
pass); monitored (the script calls trainstack.monitor.start itself, as a loop instrumented by hand does);
own-comm-hook (the script registers a DDP communication hook of its own, and prints how many buckets it reduced);
fsdp (the model sharded by FSDP2's fully_shard instead of DDP).
"""

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

WIDTH = 256
BATCH = 8192
"""Enough compute per step that the gradient all-reduce over gloo hides behind it: a healthy run is no
communication-bound one."""
EXTRA_SECONDS = 0.05
BATCH_WAIT_SECONDS = 0.05


def busy(seconds: float) -> None:
    """Real compute, not a sleep: a sleeping rank leaves its core to its peer."""
    work = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


class Batches(torch.utils.data.Dataset):
    """Each item a whole batch (the DataLoader's batch_size=None): the same one, made once, so that a healthy
    loader costs next to nothing."""

    def __init__(self, size: int, wait: float):
        self.inputs = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(dist.get_rank()))
        self.targets = self.inputs.sum(dim=1, keepdim=True)
        self.size, self.wait = size, wait

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if self.wait:
            time.sleep(self.wait)
        return self.inputs, self.targets


class Model(torch.nn.Module):
    def __init__(self, slow: bool):
        super().__init__()
        self.inner = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.out = torch.nn.Linear(WIDTH, 1)
        self.slow = slow

    def forward(self, inputs):
        if self.slow and self.training:
            busy(EXTRA_SECONDS)
        return self.out(torch.relu(self.norm(self.inner(inputs))))


def main() -> int:
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = dist.get_rank()
    if mode == "fsdp":  # FSDP2: its layers sharded, then the root
        from torch.distributed.fsdp import fully_shard

        model = Model(slow=False)
        fully_shard(model.inner)
        fully_shard(model)
    else:
        model = DistributedDataParallel(Model(slow=mode == "slow-forward" and rank == 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    reduced = [0]
    if mode == "own-comm-hook":

        def counting_allreduce(state, bucket):
            reduced[0] += 1
            return default_hooks.allreduce_hook(None, bucket)

        model.register_comm_hook(None, counting_allreduce)
    if mode == "monitored":
        import trainstack.monitor

        monitor = trainstack.monitor.start(model, optimizer=optimizer)
    wait = BATCH_WAIT_SECONDS if mode == "slow-loader" else 0.0
    loader = torch.utils.data.DataLoader(Batches(steps, wait), batch_size=None)
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mode == "monitored":
            monitor.step(samples=len(inputs), loss=loss)
    model.eval()
    with torch.no_grad():
        model(torch.randn(BATCH, WIDTH))
    model.train()
    if rank == 0:
        torch.save(getattr(model, "module", model).state_dict(), os.devnull)
    if mode == "healthy":  # a sharded checkpoint too, on every rank
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": model.module.state_dict()}, checkpoint_id=tempfile.mkdtemp(prefix="plain-ddp-"))
        dist.barrier()  # every rank past the save before the group goes
    if mode == "monitored":
        monitor.close()
    if mode == "own-comm-hook":
        print(f"COUNTED_BUCKETS {reduced[0]}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
