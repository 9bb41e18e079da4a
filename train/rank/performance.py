"""The settings that make a GPU run fast: TF32, fused AdamW, torch.compile, and the compile watch that keeps
compilation out of the step times and counts recompiles.

CPU ranks keep PyTorch's defaults (TF32 and the fused optimizer are CUDA features); `--compile` works on both.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import torch
from torch import nn


def use_tf32(config, device: torch.device) -> None:
    """fp32 matmuls on the tensor cores as TF32 (10-bit mantissa): what nanoGPT and Lightning turn on. Convolutions
    already use TF32 by default in PyTorch; `--no-tf32` turns both off."""
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if config.tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = config.tf32


def make_optimizer(model: nn.Module, config, device: torch.device) -> torch.optim.Optimizer:
    # fused=True: one CUDA kernel updates every parameter, instead of several kernels per parameter group.
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=device.type == "cuda" and config.fused_adamw,
    )


def bucket_count(config) -> int:
    """How many sequence lengths a compiled model meets: multiples of --bucket-size up to --seq-len."""
    return math.ceil(config.seq_len / config.bucket_size)


def compile_in_place(model: nn.Module, config) -> None:
    """Compile before Accelerate wraps the model: `nn.Module.compile` keeps the module (no `_orig_mod.` in the
    state_dict, so checkpoints load with or without --compile) and DDP wraps the compiled module, never the
    other way round (Accelerate compiling the DDP wrapper: accelerate#3991). Static shapes: each length bucket
    compiles once to kernels specialised for it, instead of dynamic-shape kernels after the second length."""
    _allow_recompiles(bucket_count(config) + 1)
    model.compile(backend=config.compile_backend, dynamic=False)


def _allow_recompiles(limit: int) -> None:
    # Private torch API (torch 2.13): dynamo gives up compiling a frame after `recompile_limit` (default 8)
    # versions and runs it eagerly from then on. Each bucket is one version, so the limit must cover them.
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)


def _on_frame_compiled(callback: Callable[[], None]) -> Callable[[], None]:
    """Private torch API (torch 2.13 has no public "a graph was compiled" hook): dynamo's compile callbacks run
    once for each frame it compiles, the first time and at every recompile. Returns the function that removes
    the callback."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    def on_end(args) -> None:
        if args.callback_trigger == CallbackTrigger.DYNAMO:
            callback()

    callback_handler.register_end_callback(on_end)
    return lambda: callback_handler.remove_end_callback(on_end)


class NoCompileWatch:
    """The compile watch when it is off, the same methods doing nothing (the loop calls them unconditionally).
    Without --compile (or before the model is compiled): no step compiles; summary.json's compile_seconds and
    recompiles are null."""

    seconds = None
    recompiles = None

    def step_done(self) -> None:
        return None

    def resync(self) -> None:
        pass

    def close(self) -> None:
        pass


class CompileWatch:
    """Counts compiled frames per step. A step during which something compiled is compile time, not step time
    (its lazily compiled backward is in the same step). The first step's count is the frames one batch shape
    needs; each new shape recompiles them, so more than that times the buckets means something else changes
    shape (a factory's samples longer than --seq-len, a varying batch size) or guards fail: warned once."""

    def __init__(self, buckets: int, warn=lambda line: print(line, file=sys.stderr, flush=True)):
        self.buckets = buckets
        self.compiles = 0
        self.per_shape = 0  # frames compiled for the first batch shape
        self.seconds = 0.0
        self._warn = warn
        self._warned = False
        self._seen = 0
        self._step_started = time.perf_counter()
        self._remove = _on_frame_compiled(self._compiled)

    def _compiled(self) -> None:
        self.compiles += 1

    @property
    def recompiles(self) -> int:
        return self.compiles - self.per_shape

    def step_done(self) -> tuple[float, int] | None:
        """Call once per optimizer step: (its seconds, its recompiles) when this step compiled, else None."""
        now, started = time.perf_counter(), self._step_started
        self._step_started = now
        if self.compiles == self._seen:
            return None
        recompiles_before = self._seen - self.per_shape
        self.per_shape = self.per_shape or self.compiles
        self._seen = self.compiles
        self.seconds += now - started
        if self.recompiles > self.per_shape * (self.buckets - 1) and not self._warned:
            self._warned = True
            self._warn(
                f"trainstack: warning: {self.recompiles} recompiles exceed the {self.buckets} length "
                "buckets: some batch shape falls outside them, and each new one compiles again "
                "(TORCH_LOGS=recompiles shows why)"
            )
        return now - started, self.recompiles - recompiles_before

    def resync(self) -> None:
        """After a checkpoint or evaluation: that pause is not compile time."""
        self._step_started = time.perf_counter()

    def close(self) -> None:
        self._remove()
