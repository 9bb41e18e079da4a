"""A hang's evidence written by hand: each rank's stack and flight-recorder entries in a stall folder."""

from __future__ import annotations

import json
from pathlib import Path

SITE = "/venv/lib/python3.11/site-packages"
C10D = {"file": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 3252, "function": "all_reduce"}


def entry(seq: int, op: str = "all_reduce", sizes=((4,),)) -> dict:
    return {
        "pg_id": 0,
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "input_sizes": sizes,
        "state": "scheduled",
    }


def write_rank(stall: Path, rank: int, stack: list[dict], entries: list[dict]) -> None:
    stall.mkdir(parents=True, exist_ok=True)
    (stall / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "stack": stack, "flight_recorder": entries}))


def user(line: int, function: str = "main") -> dict:
    return {"file": "/home/me/train.py", "line": line, "function": function}
