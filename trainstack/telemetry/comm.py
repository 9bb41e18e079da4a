"""Times the communication of a training step (trainstack/telemetry/comm_timer.py defines the figures). No collective
is added.

- **DDP** all-reduces the gradients in buckets while backward still computes the earlier layers' gradients: the
  reducer launches a bucket once all its gradients are ready, and `loss.backward()` returns once every bucket's
  all-reduce is done. Its one wait is at the end of backward, from the end of backward compute (the last bucket's
  launch) to the end of the last all-reduce. The step's communication is timed as one collective, in flight from
  its first bucket's launch to the end of the last all-reduce: on a CPU rank from the marks DDP's reducer takes
  itself, on a GPU rank from autograd's hooks (trainstack/telemetry/ddp_comm.py says how and why).
- **DDP's buffer broadcast**: with `broadcast_buffers=True` (the default) a model with buffers (BatchNorm's running
  statistics, a causal mask) has rank 0's buffers broadcast at the start of every forward pass, so a rank waits
  there for a slower peer; timed as the broadcast alone, whatever other forward pre-hooks the model carries
  (ddp_comm.py).
- Every other collective the rank calls (a framework's, the loop's own): trainstack/telemetry/collectives.py.
- **FSDP2** (train/rank/sharding.py) all-gathers each unit's parameters before its forward and again before its
  backward, and reduce-scatters its gradients after; compute waits for each all-gather where the unit needs its
  parameters, and for each reduce-scatter before the next unit's (trainstack/telemetry/fsdp_comm.py has the marks and
  which waits are where).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable

import torch

from trainstack.telemetry.comm_timer import CommTimer
from trainstack.telemetry.ddp_comm import time_ddp
from trainstack.telemetry.future_callbacks import FutureCallbacks

# Test-only: seconds each collective (DDP's gradient all-reduce, FSDP's all-gather and reduce-scatter) is held back
# after it finishes, as a slow link would (DDP's is then timed by hooks: ddp_comm.py). The tests that make a run
# communication-bound set it (tests/timing/test_diagnose.py); nothing else reads it.
TEST_ALLREDUCE_DELAY_ENV = "TRAINSTACK_TEST_ALLREDUCE_DELAY"


class InjectedDelay:
    """Test-only (TEST_ALLREDUCE_DELAY_ENV): holds each collective back after it finishes, one after another as
    collectives on one link are."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> InjectedDelay:
        return cls(float(os.environ.get(TEST_ALLREDUCE_DELAY_ENV, "0")))

    def __call__(self) -> None:
        if self.seconds:
            with self._lock:
                time.sleep(self.seconds)


_TIMED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""DDP models timed already in this process: a second `watch` of one adds no second set of marks."""


def watch_gradient_communication(
    model: torch.nn.Module,
    timer: CommTimer,
    callbacks: FutureCallbacks,
    training: Callable[[], bool],
) -> bool:
    """Times a DDP model's gradient all-reduce and buffer broadcast, or an FSDP2 model's all-gathers and
    reduce-scatters; False (nothing registered) for anything else, and for FSDP on one rank, which communicates
    nothing. `training()`: whether the loop trains now (no pause is open). `callbacks` registers the marks that end
    an FSDP collective."""
    delay = InjectedDelay.from_environment()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        if model not in _TIMED:
            _TIMED.add(model)
            time_ddp(model, timer, training, delay if delay.seconds else None)
        return True
    # Only a model wrapped by torch.distributed.fsdp can be an FSDP module, and importing that package costs each
    # rank about a second of CPU (torch.distributed.tensor): a DDP or plain model never loads it.
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from trainstack.telemetry.fsdp_comm import watch_fsdp_communication

    return watch_fsdp_communication(model, timer, delay, callbacks)
