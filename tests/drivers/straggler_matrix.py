"""Phases of a small DDP loop under trainstack.monitor, one after another in one process group: each phase a fresh
model, its own run directory (OUT_DIR/<phase>) and, in some, one rank given real extra work each step in one part
of its step. tests/timing/test_straggler.py judges each phase from its records.

Run under `torch.distributed.run --nproc-per-node 2`: straggler_matrix.py OUT_DIR [PHASE ...] (default: every
phase). Extra work is busy compute, not a sleep: a rank that sleeps leaves its core to its peer, which then runs
faster than it would beside a busy straggler.
"""

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import trainstack.monitor

STEPS = 30
HEALTHY_STEPS = 4 * STEPS
"""A healthy step is a fraction of a slowed one (11 ms against 60 on a quick host), so a healthy phase runs more of
them: a burst of the host's own work on one core (100 ms of it named a rank of a 0.7 s phase a straggler once, at
0.20) weighs as little in it as in the slowed phases."""
LOG_EVERY = 5
BATCH = 128
WIDTH = 512
EXTRA_SECONDS = 0.05
"""The straggler's extra work per step, more than a healthy step's time: on a busy shared CPU the peer's own compute
slows while the straggler works, which hides part of the wait, and a longer wait keeps that part a small share."""


@dataclass(frozen=True)
class Phase:
    name: str
    buffers: bool
    """The model has buffers (BatchNorm's running statistics and a registered mask), which DDP broadcasts."""
    broadcast_buffers: bool = True
    slow_rank: int = -1
    slow_in: str = ""
    """forward, after_step (after the optimizer step), data (in the loader), metric (after the optimizer step,
    before the loop's all-reduce of its loss) or pre_hook (in a forward pre-hook of the user's on the wrapped
    module); "" for a healthy phase."""

    @property
    def steps(self) -> int:
        return STEPS if self.slow_in else HEALTHY_STEPS


PHASES = [
    Phase(f"{model}-{where or 'healthy'}", buffers, broadcast, rank, where)
    for model, buffers, broadcast in (("buffers", True, True), ("no-broadcast", True, False), ("plain", False, True))
    for where, rank in (("", -1), ("forward", 1), ("after_step", 0), ("data", 1))
] + [
    # A wait at the loop's own collective, and work in a pre-hook the broadcast's timing must leave out (issue 43)
    Phase("plain-metric", False, True, 1, "metric"),
    Phase("buffers-pre_hook", True, True, 1, "pre_hook"),
]


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.hidden = torch.nn.Linear(WIDTH, WIDTH)
        self.out = torch.nn.Linear(WIDTH, 1)
        self.register_buffer("mask", torch.ones(WIDTH))

    def forward(self, inputs):
        hidden = torch.relu(self.norm(self.inner(inputs)) * self.mask)
        return self.out(torch.relu(self.hidden(hidden)))


def plain_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1),
    )


def busy(seconds: float) -> None:
    """Compute until `seconds` have passed: small matmuls, as a slower rank's own work would be."""
    work = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


def batches(rank: int, phase: Phase):
    generator = torch.Generator().manual_seed(rank)
    while True:
        if phase.slow_in == "data" and rank == phase.slow_rank:
            busy(EXTRA_SECONDS)
        inputs = torch.randn(BATCH, WIDTH, generator=generator)
        yield inputs, inputs.sum(dim=1, keepdim=True)


def run_phase(phase: Phase, run_dir: Path) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow = rank == phase.slow_rank
    inner = WithBuffers() if phase.buffers else plain_model()
    if slow and phase.slow_in == "pre_hook":  # registered before wrapping, as PEFT or Accelerate's hooks are
        inner.register_forward_pre_hook(lambda module, args: busy(EXTRA_SECONDS))
    model = DistributedDataParallel(inner, broadcast_buffers=phase.broadcast_buffers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = trainstack.monitor.start(
        model, optimizer=optimizer, run_dir=run_dir, log_every=LOG_EVERY, run_id=phase.name
    )
    for _, (inputs, targets) in zip(range(phase.steps), monitor.batches(batches(rank, phase)), strict=False):
        with monitor.forward():
            if slow and phase.slow_in == "forward":
                busy(EXTRA_SECONDS)
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if slow and phase.slow_in in ("after_step", "metric"):
            busy(EXTRA_SECONDS)
        if phase.slow_in == "metric":
            dist.all_reduce(loss.detach())  # the loop's metric, as its logging would reduce it
        monitor.step(samples=len(inputs), loss=loss)
    monitor.close()


def main() -> int:
    out_dir = Path(sys.argv[1])
    wanted = set(sys.argv[2:])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    phases = [phase for phase in PHASES if not wanted or phase.name in wanted]
    for phase in phases:
        run_phase(phase, out_dir / phase.name)
        dist.barrier()  # the next phase starts together on every rank
    if dist.get_rank() == 0:
        (out_dir / "phases.json").write_text(
            json.dumps({"extra_seconds": EXTRA_SECONDS, "phases": [asdict(phase) for phase in phases]})
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
