"""The compile watch: a step during which torch.compile compiled is compile time, not step time, and its
recompiles are counted. `trainstack train --compile` runs it with its length buckets; `trainstack watch` runs it in
every rank it instruments (trainstack/auto/instrument.py), where a script compiles its model itself."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


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
    needs; each new shape recompiles them, so more than that times `buckets` (the batch shapes a run means to
    have; None: unknown) means something else changes shape (a factory's samples longer than --seq-len, a varying
    batch size) or guards fail: warned once. Frames compiled during a pause (an evaluation's own graph, in eval
    mode or without grad) are the pause's: neither the next step's compile time nor a training recompile."""

    def __init__(self, buckets: int | None = None, warn=lambda line: print(line, file=sys.stderr, flush=True)):
        self.buckets = buckets
        self.compiles = 0
        self.per_shape = 0  # frames compiled for the first batch shape
        self.in_pauses = 0  # frames compiled while the loop paused
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
        return self.compiles - self.per_shape - self.in_pauses

    def step_done(self) -> tuple[float, int] | None:
        """Call once per optimizer step: (its seconds, its recompiles) when this step compiled, else None."""
        now, started = time.perf_counter(), self._step_started
        self._step_started = now
        if self.compiles == self._seen:
            return None
        recompiles_before = self._seen - self.per_shape - self.in_pauses
        self.per_shape = self.per_shape or self.compiles - self._seen
        self._seen = self.compiles
        self.seconds += now - started
        if self.buckets is not None and self.recompiles > self.per_shape * (self.buckets - 1) and not self._warned:
            self._warned = True
            self._warn(
                f"trainstack: warning: {self.recompiles} recompiles exceed the {self.buckets} length "
                "buckets: some batch shape falls outside them, and each new one compiles again "
                "(TORCH_LOGS=recompiles shows why)"
            )
        return now - started, self.recompiles - recompiles_before

    def resync(self) -> None:
        """After a checkpoint or evaluation: that pause is not compile time, and what it compiled is its own."""
        self._step_started = time.perf_counter()
        self.in_pauses += self.compiles - self._seen
        self._seen = self.compiles

    def close(self) -> None:
        self._remove()
