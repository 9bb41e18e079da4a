"""A plain DDP loop with no trainstack line (unless asked): a BatchNorm model on CPU ranks over gloo, fed by a
DataLoader; after it an evaluation and checkpoints (torch.save on rank 0; in the phases mode rank 0's evaluation of
the wrapped module alone first, its safetensors write of the model and torch.distributed.checkpoint's on every rank
too). tests/process/test_auto_instrument.py and
tests/timing/test_watched_matrix.py run it under `trainstack watch -- torchrun ...`, where the automatic
instrumentation (trainstack/auto/) must see it.

    plain_ddp.py MODE [STEPS [PHASES_JSON [LAST_PHASE]]]

MODE: slow-loader (every batch waits in __getitem__); monitored (the script calls trainstack.monitor.start itself,
as a loop instrumented by hand does); own-comm-hook (the script registers a DDP communication hook of its own, and
prints how many buckets it reduced); phases, fsdp-phases (DDP's or FSDP2's model, sharded by fully_shard, through
the PHASES below, one after another in one loop, STEPS steps each: rank 0 writes which steps each took and the batch
to PHASES_JSON), up to LAST_PHASE if given.
"""

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import safetensors.torch  # above torch, as isort orders them: it imports torch itself
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

WIDTH = 256
BATCH = 8192
"""Enough compute per step that the gradient all-reduce over gloo hides behind it: a healthy run is no
communication-bound one."""
SAVED_BYTES = 256 << 20
"""What a rank that saves alone writes after each step: 60-80 ms of serializing on a CPU of this machine, most of a
step. At 64 MB (about 20 ms) its peer's extra wait read 12-26 ms a step from launch to launch, at times under the
straggler threshold: the peer's own compute slows and speeds on the shared cores by as much."""
EXTRA_SECONDS = 0.1
"""A slowed rank's extra work per step, and a slow loader's wait per batch. On a host whose cores other work shares,
a slowed rank's own compute runs faster or slower than its peer's as the scheduler hands out the cores (faster
while its peer sleeps in a wait, slower after it worked): the more extra work, the smaller a share of it that is."""


@dataclass(frozen=True)
class Phase:
    name: str
    slow_in: str = ""
    """loader (every rank's loader waits: input-bound), or where one rank works EXTRA_SECONDS more each step:
    forward, after_step (after its optimizer step), data (in its loader), metric (after its optimizer step, before
    the loop's all-reduce of its loss, which only this phase makes), pre_hook (in a forward pre-hook the script
    registered on the model before wrapping it, as PEFT or Accelerate do) or save (a checkpoint this rank alone
    saves after each step, `torch.save` of SAVED_BYTES, as the seeds' `if rank == 0: torch.save(...)`); "" for a
    healthy phase."""
    slow_rank: int = -1


HEALTHY, SLOW_LOADER = Phase("healthy"), Phase("slow-loader", "loader")
STRAGGLERS = [Phase("forward", "forward", 1), Phase("after_step", "after_step", 0), Phase("data", "data", 1)]
PHASES = {
    "phases": [
        SLOW_LOADER,
        HEALTHY,
        *STRAGGLERS,
        Phase("lone_save", "save", 0),
        Phase("metric", "metric", 1),
        Phase("pre_hook", "pre_hook", 1),
    ],
    "fsdp-phases": [SLOW_LOADER, HEALTHY, *STRAGGLERS],
}
"""The slow loader's phase first: the start-up's noise lands in it (the launcher's, watch's and the exporter's own
work on the shared cores), where a 100 ms wait a batch dwarfs it, not in the healthy phase's short steps."""


def busy(seconds: float) -> None:
    """Real compute, not a sleep: a sleeping rank leaves its core to its peer."""
    work = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


class Batches(torch.utils.data.Dataset):
    """Each item a whole batch (the DataLoader's batch_size=None): the same one, made once, so that a healthy
    loader costs next to nothing. Item i is step i + 1's batch, slowed as that step's phase says."""

    def __init__(self, phases: list[Phase], steps_each: int, batch: int):
        self.inputs = torch.randn(batch, WIDTH, generator=torch.Generator().manual_seed(dist.get_rank()))
        self.targets = self.inputs.sum(dim=1, keepdim=True)
        self.phases, self.steps_each = phases, steps_each

    def __len__(self) -> int:
        return len(self.phases) * self.steps_each

    def __getitem__(self, index: int):
        slow_in = slowed_in(self.phases[index // self.steps_each])
        if slow_in == "loader":
            time.sleep(EXTRA_SECONDS)  # every rank waits alike: no core taken from a peer
        elif slow_in == "data":
            busy(EXTRA_SECONDS)
        return self.inputs, self.targets


def slowed_in(phase: Phase) -> str:
    """Where this rank is slowed in `phase`: every rank's loader, or this rank's part of its step; "" if nowhere."""
    return phase.slow_in if phase.slow_rank in (-1, dist.get_rank()) else ""


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.out = torch.nn.Linear(WIDTH, 1)
        self.slow_in = ""  # this step's slowed_in, set by the loop
        self.register_forward_pre_hook(
            lambda module, args: busy(EXTRA_SECONDS) if module.slow_in == "pre_hook" else None
        )

    def forward(self, inputs):
        if self.slow_in == "forward" and self.training:
            busy(EXTRA_SECONDS)
        return self.out(torch.relu(self.norm(self.inner(inputs))))


def main() -> int:
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    phases = PHASES.get(mode, [SLOW_LOADER if mode == "slow-loader" else HEALTHY])
    if len(sys.argv) > 4:
        phases = phases[: [phase.name for phase in phases].index(sys.argv[4]) + 1]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = dist.get_rank()
    inner = Model()
    # FSDP2 gathers and scatters its parameters at every step, all of it exposed on a CPU: twice the compute keeps
    # gloo's collectives under a quarter of a healthy step (comm-bound)
    batch = 2 * BATCH if mode == "fsdp-phases" else BATCH
    if mode == "fsdp-phases":  # FSDP2: its layers sharded, then the root
        from torch.distributed.fsdp import fully_shard

        fully_shard(inner.inner)
        model = fully_shard(inner)
    else:
        model = DistributedDataParallel(inner)
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
    loader = torch.utils.data.DataLoader(Batches(phases, steps, batch), batch_size=None)
    saved_state = None  # what rank 0 saves alone, made at its first such save
    for index, (inputs, targets) in enumerate(loader):
        inner.slow_in = slow_in = slowed_in(phases[index // steps])
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if slow_in in ("after_step", "metric"):
            busy(EXTRA_SECONDS)
        elif slow_in == "save":
            saved_state = saved_state if saved_state is not None else torch.zeros(SAVED_BYTES // 4)
            torch.save({"model": inner.state_dict(), "state": saved_state}, os.devnull)
        if phases[index // steps].slow_in == "metric":
            dist.all_reduce(loss.detach())  # the loop's metric, as its logging would reduce it
        if mode == "monitored":
            monitor.step(samples=len(inputs), loss=loss)
    inner.slow_in = ""
    if rank == 0 and len(sys.argv) > 3:
        written = [asdict(phase) | {"after": n * steps, "upto": (n + 1) * steps} for n, phase in enumerate(phases)]
        with open(sys.argv[3], "w") as out:
            json.dump({"extra_seconds": EXTRA_SECONDS, "batch": batch, "phases": written}, out)
    if mode == "phases" and rank == 0:  # rank 0 alone evaluates the module DDP wraps: no forward of the DDP model
        inner.eval()
        with torch.no_grad():
            inner(torch.randn(batch, WIDTH))
        inner.train()
    model.eval()
    with torch.no_grad():
        model(torch.randn(batch, WIDTH))
    model.train()
    if rank == 0:
        torch.save(getattr(model, "module", model).state_dict(), os.devnull)
    if mode == "phases":  # two checkpoints more, in a folder beside PHASES_JSON where given
        import torch.distributed.checkpoint as dcp

        given = len(sys.argv) > 3
        folder = os.path.dirname(os.path.abspath(sys.argv[3])) if given else tempfile.mkdtemp(prefix="plain-ddp-")
        if rank == 0:  # the model as Accelerate's save_state and transformers' save_pretrained write it
            safetensors.torch.save_model(model.module, os.path.join(folder, "model.safetensors"))
        dcp.save({"model": model.module.state_dict()}, checkpoint_id=os.path.join(folder, "dcp"))  # every rank's
        dist.barrier()  # every rank past the save before the group goes
    if mode == "monitored":
        monitor.close()
    if mode == "own-comm-hook":
        sys.stdout.write(f"COUNTED_BUCKETS {reduced[0]}\n")  # one write: the two ranks share the stdout
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
