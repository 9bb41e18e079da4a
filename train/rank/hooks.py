"""What the loop calls when telemetry or the compile watch is off: the same methods, doing nothing.

The loop calls its hooks unconditionally (`telemetry.step_done(...)`, `compile_watch.resync()`), so it reads the
same with them on or off; which object it holds is decided once, when the Trainer is built.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from trainstack.train.rank.telemetry import Telemetry, training_state_bytes


class NoTelemetry:
    """`--no-telemetry`: Telemetry's methods (tests/test_train_hooks.py keeps the two alike), recording nothing."""

    def forward_started(self) -> None:
        pass

    def forward_done(self) -> None:
        pass

    def data_wait_started(self) -> None:
        pass

    def data_ready(self) -> None:
        pass

    def step_done(self, samples: int) -> None:
        pass

    def step_compiled(self, samples: int, seconds: float, recompiles: int) -> None:
        pass

    def resync_clock(self) -> None:
        pass

    def pause_started(self, part: str) -> None:
        pass

    def pause_ended(self, part: str) -> None:
        pass

    @contextmanager
    def pause(self, part: str):
        yield

    def watch_communication(self, model: torch.nn.Module) -> bool:
        """False: the gradient all-reduce is left as DDP runs it, untimed."""
        return False

    def interval_ended(self) -> None:
        return None

    def interval_done(self, cut: None, step: int, epoch: int, loss: float, lr: float, tokens: int) -> float | None:
        """None: no data-wait share to show on the progress bar."""
        return None

    def state_measured(self, sizes: dict[str, int]) -> None:
        pass

    def checkpoint_done(self, duration: float) -> None:
        pass

    def close(self) -> None:
        pass


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
