"""What the garbage collector costs a rank's start and exit, and what trainstack/heap.py saves of it.

Each trial is a fresh process that imports what a CPU rank imports (torch, torch._dynamo, Accelerate, datasets),
times one full collection, and exits: once with the collector as Python leaves it, once as a rank runs it (the
imports under `imports_uncollected`). The two kinds alternate, so a drift in the host's load falls on both alike.
Printed: each kind's median wall time from start to exit and its CPU time, their ratio, and the full collection's
time. Targets (issue 29): the rank's way takes no more than 0.9 of the default's wall time, and its full
collection under a tenth of the default's.

    .venv/bin/python bench/rank_heap.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_WALL_RATIO = 0.9
TARGET_COLLECTION_RATIO = 0.1

TRIAL = """
import gc, json, sys, time
if sys.argv[1] == "rank":
    from trainstack.heap import imports_uncollected
    with imports_uncollected():
        import torch, torch._dynamo, accelerate, datasets
else:
    import torch, torch._dynamo, accelerate, datasets
started = time.perf_counter()
gc.collect()
print(json.dumps({"collection_seconds": time.perf_counter() - started, "objects": len(gc.get_objects())}))
"""


def trial(kind: str) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", TRIAL, kind], cwd=REPO, capture_output=True, text=True, check=True, timeout=300
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, **json.loads(done.stdout)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {"default": [], "rank": []}
    for pair in range(args.pairs):
        for kind in ("default", "rank") if pair % 2 == 0 else ("rank", "default"):
            found[kind].append(trial(kind))

    def median(kind: str, key: str) -> float:
        return statistics.median(t[key] for t in found[kind])

    for kind in found:
        print(
            f"{kind:8s} wall {median(kind, 'wall'):.2f} s  cpu {median(kind, 'cpu'):.2f} s  "
            f"full collection {median(kind, 'collection_seconds') * 1000:.1f} ms "
            f"(the collector tracks {median(kind, 'objects'):,.0f} objects)"
        )
    wall_ratio = median("rank", "wall") / median("default", "wall")
    collection_ratio = median("rank", "collection_seconds") / median("default", "collection_seconds")
    print(f"rank/default wall {wall_ratio:.3f} (target <= {TARGET_WALL_RATIO})")
    print(f"rank/default full collection {collection_ratio:.4f} (target < {TARGET_COLLECTION_RATIO})")
    return 0 if wall_ratio <= TARGET_WALL_RATIO and collection_ratio < TARGET_COLLECTION_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
