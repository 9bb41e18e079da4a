"""Python's cyclic garbage collector in a training process: off while torch loads, and kept off the objects that
setup builds for the life of the run.

A rank's heap is mostly torch, its compiler, Accelerate and datasets: millions of objects made at import, none of
them garbage. The collector cannot know that, so it walks them:
- while they load, each full collection walking everything loaded so far: 0.6 s of a rank's 5 s of imports on a
  CPU host;
- at every full collection during training (0.15 s for a rank's 360,000 objects here), on whichever rank it
  happens to strike: a pause the other ranks then wait for at the next all-reduce;
- once more as the interpreter exits, about a second per rank.
Frozen (gc.freeze), they sit in a generation no collection visits, and the loader workers forked from the rank do
not copy the pages a collection would have written to. Collection stays on everywhere else: setup's own garbage, and
the training loop's, are still collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_what_is_built", "imports_uncollected"]


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """Imports made inside run with the collector off, and what they loaded is frozen: modules live as long as the
    process, so collecting among them finds nothing."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def freeze_what_is_built() -> None:
    """What exists now lives for the run (the model, its optimizer, the loaders, the lazily imported modules):
    no later collection walks it. Called right before the loader workers fork."""
    gc.freeze()
