"""FSDP2's communication times (trainstack/telemetry/fsdp_comm.py, trainstack/telemetry/comm_timer.py).

Real FSDP2 on two gloo ranks gives the schedule: which waits the hooks find and which collectives each waits for,
as on a GPU rank (where collectives run beside compute), and, on these CPU ranks, the times themselves (gloo's
collectives hold the host, so all of each is exposed). A fake GPU with a compute stream and a communication
stream gives the times such a schedule implies on a device's clock, worked out by hand."""

from __future__ import annotations

import itertools
import json
import multiprocessing
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule, fully_shard

from trainstack.telemetry.comm import InjectedDelay
from trainstack.telemetry.comm_timer import CommTimer, HostClock, StepComm
from trainstack.telemetry.fsdp_comm import REDUCE_SCATTERS, FsdpCommWatch
from trainstack.telemetry.future_callbacks import FutureCallbacks

BLOCKS = 3
DELAY = 0.05


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class Net(torch.nn.Module):
    """Token ids in, as the built-in GPT: the root unit's inputs need no gradient. Every first dimension is even,
    so that two ranks' shards need no padding and the sizes below are exact."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(32, 64)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(64, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sharded() -> Net:
    """Sharded as Accelerate shards a model with tied input and output embeddings: each block, the embedding with
    the head as one unit that stays gathered after its forward, and the root, which is left with no parameter."""
    torch.manual_seed(0)
    net = Net()
    for block in net.blocks:
        fully_shard(block)
    fully_shard([net.embedding, net.head], reshard_after_forward=False)
    return fully_shard(net)


class Ticks:
    """A clock whose marks are distinct numbers in the order they were taken."""

    def __init__(self) -> None:
        self._count = itertools.count()

    def mark(self) -> int:
        return next(self._count)

    def seconds(self, start: int, end: int) -> float:
        return float(end - start)

    def wait(self, mark: int) -> None:
        pass

    def release(self, marks: list[int]) -> None:
        pass


class ScheduleTimer(CommTimer):
    """Names each collective (reduce-scatters by their order in the step); treats none as blocking, as on a GPU
    rank, so that every wait FSDP makes shows."""

    def __init__(self, names: dict[torch.nn.Module, str]):
        super().__init__(Ticks())
        self.names = names
        self.labels: dict[int, str] = {}
        self._reduce_scatters = itertools.count(1)

    def launched(self, nbytes, group=None, blocking=False):
        collective = super().launched(nbytes, group)
        self.labels[collective.launched] = (
            f"reduce-scatter {next(self._reduce_scatters)}"
            if group == REDUCE_SCATTERS
            else f"all-gather {self.names[group]}"
        )
        return collective

    def step_done(self) -> None:
        super().step_done()
        self._reduce_scatters = itertools.count(1)

    def schedule(self) -> list[list[tuple[str, list[str], int]]]:
        """Each step's waits: where compute reached the wait ("mark": a hook's mark, "launch": the collective's
        own launch), the collectives it waited for, and how many of the step's collectives had been launched
        when compute reached it (which pins the hook between FSDP's own)."""
        return [
            [
                (
                    "launch" if wait.ready == wait.collectives[-1].launched else "mark",
                    [self.labels[c.launched] for c in wait.collectives],
                    sum(c.launched < wait.ready for c in step.collectives),
                )
                for wait in step.waits
            ]
            for step in self.cut()
        ]


def train(net: torch.nn.Module, timer: CommTimer, steps: int) -> None:
    optimizer = torch.optim.AdamW(net.parameters())
    for _ in range(steps):
        net(torch.randint(0, 32, (4, 8))).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        timer.step_done()
    with torch.no_grad():  # an evaluation: its all-gathers are not training communication
        net.eval()(torch.randint(0, 32, (4, 8)))
    timer.step_done()


def rank_main(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store", 2), rank=rank, world_size=2)
    net = sharded()
    names: dict[object, str] = {}
    for name, module in net.named_modules():
        if isinstance(module, FSDPModule):
            unit = fully_shard.state(module)
            names[unit] = f"{names[unit]}+{name}" if unit in names else name or "root"
    scheduled = ScheduleTimer(names)
    callbacks = FutureCallbacks()
    FsdpCommWatch(net, scheduled, InjectedDelay(0), callbacks)
    train(net, scheduled, steps=2)
    timer = CommTimer(HostClock())
    net = sharded()
    FsdpCommWatch(net, timer, InjectedDelay(DELAY), callbacks)
    train(net, timer, steps=2)
    result = {"schedule": scheduled.schedule(), "steps": [asdict(step) for step in timer.read(timer.cut())]}
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(result))
    # As a Monitor closes: a gloo thread still holding one of the callbacks as the process exits aborts it.
    callbacks.wait_released()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("fsdp-comm")
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=rank_main, args=(rank, str(folder))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
    assert [process.exitcode for process in ranks] == [0, 0]
    return [json.loads((folder / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


# Forward: each unit's mark comes before FSDP's pre-forward launches its all-gather and waits for it; the embedding's
# and head's are one all-gather, waited for before the embedding.
FORWARD = [
    ("mark", ["all-gather embedding+head"], 0),
    *(("mark", [f"all-gather blocks.{i}"], i + 1) for i in range(BLOCKS)),
]
BACKWARD = [
    ("mark", ["all-gather blocks.2"], 5),  # prefetched by the head's backward; marked before block 2's prefetch
    ("mark", ["all-gather blocks.1"], 7),  # prefetched by block 2's backward, after its reduce-scatter's launch
    ("mark", ["reduce-scatter 1"], 8),  # block 1's post-backward waits for block 2's reduce-scatter
    ("mark", ["all-gather blocks.0"], 9),
    ("mark", ["reduce-scatter 2"], 9),
    ("launch", ["reduce-scatter 3"], 9),  # block 0's, waited for in the end-of-backward callback
    ("launch", ["reduce-scatter 4"], 10),  # the embedding's and head's (token ids need no gradient), at the end
]


@pytest.mark.slow
def test_each_collective_is_waited_for_where_fsdp_waits(two_ranks):
    for rank in two_ranks:
        assert [[tuple(wait) for wait in step] for step in rank["schedule"]] == [FORWARD + BACKWARD] * 2


@pytest.mark.slow
def test_a_cpu_rank_waits_for_all_of_each_collective(two_ranks):
    """gloo's collectives hold the host; each is held back DELAY longer by the test delay."""
    net = Net()
    params = {
        name: sum(p.numel() for p in module.parameters()) for name, module in (("all", net), ("blocks", net.blocks))
    }
    collectives = 2 * (BLOCKS + 1) + BLOCKS  # an all-gather and a reduce-scatter per unit, the blocks' backward
    for rank in two_ranks:
        steps = [StepComm(**step) for step in rank["steps"]]
        assert len(steps) == 2
        for step in steps:
            assert step.buckets == collectives
            assert step.bytes == 4 * (2 * params["all"] + params["blocks"])  # fp32, unsharded sizes
            assert step.exposed_seconds == pytest.approx(step.seconds)
            assert step.seconds >= collectives * DELAY
