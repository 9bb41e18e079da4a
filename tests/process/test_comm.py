"""Gradient-communication timing on two real gloo ranks: the timed all-reduce averages the gradients as DDP's own
does (the times from marks on a stand-in clock: tests/unit/trainstack/test_comm.py)."""

from __future__ import annotations

import pytest
import torch

from trainstack.telemetry.comm import watch_gradient_communication
from trainstack.telemetry.comm_timer import CommTimer, HostClock
from trainstack.telemetry.future_callbacks import FutureCallbacks, settle_gloo_threads


def ddp_gradients_with_and_without_the_timing(rank: int, folder: str) -> None:
    """One backward of the same DDP model on each rank's own batch, with DDP's own all-reduce and with the timed one;
    writes both sets of gradients."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store", 2), rank=rank, world_size=2)
    gradients = {}
    for timed in (False, True):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
        )
        callbacks = FutureCallbacks()
        if timed:
            watch_gradient_communication(model, CommTimer(HostClock()), callbacks, training=lambda: True)
        batch = torch.Generator().manual_seed(rank)
        model(torch.randn(4, 8, generator=batch)).square().sum().backward()
        assert callbacks.wait_released()
        gradients[timed] = [parameter.grad.clone() for parameter in model.parameters()]
    torch.save(gradients, f"{folder}/rank-{rank}.pt")
    settle_gloo_threads()  # as a closing Monitor does: gloo's thread drops the last all-reduce's tensors (GIL)
    dist.destroy_process_group()


@pytest.mark.slow
def test_the_timed_all_reduce_averages_the_gradients_as_ddps_own(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(target=ddp_gradients_with_and_without_the_timing, args=(rank, str(tmp_path))) for rank in (0, 1)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
    assert [process.exitcode for process in ranks] == [0, 0]
    results = [torch.load(tmp_path / f"rank-{rank}.pt") for rank in (0, 1)]
    for result in results:
        for own, timed in zip(result[False], result[True], strict=True):
            assert torch.allclose(own, timed), (own, timed)
    # the ranks' batches differ, so equal gradients on both are the mean, not a rank's own
    assert all(torch.equal(a, b) for a, b in zip(results[0][True], results[1][True], strict=True))
