"""The compile watch when it is off (the same methods, doing nothing), and the one-time measure of a rank's state.

The loop calls its hooks unconditionally (`compile_watch.resync()`; telemetry's off-switch is trainstack.monitor's
NullMonitor), so it reads the same with them on or off; which object it holds is decided once, when it is built.
"""

from __future__ import annotations

import torch

from trainstack.train.rank.telemetry import Telemetry, training_state_bytes


class NoCompileWatch:
    """Without --compile (or before the model is compiled): no step compiles; summary.json's compile_seconds and
    recompiles are null."""

    seconds = None
    recompiles = None

    def step_done(self) -> None:
        return None

    def resync(self) -> None:
        pass

    def close(self) -> None:
        pass


def measure_state_once(model: torch.nn.Module, optimizer: torch.optim.Optimizer, telemetry: Telemetry) -> None:
    """At the first optimizer step, once: the bytes of parameters, gradients and optimizer state stay the same for
    the rest of the run, and only right after a step do the gradients and the optimizer state all exist."""

    def measure(inner: torch.optim.Optimizer, args, kwargs) -> None:
        handle.remove()
        telemetry.state_measured(training_state_bytes(model, inner))

    handle = optimizer.register_step_post_hook(measure)
