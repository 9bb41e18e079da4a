"""A run directory's lease with its timeout and its lines at hand, and what a folder held."""

from __future__ import annotations

from pathlib import Path

from trainstack.supervisor.lease import RunDirLease


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for a folder): what "writes nothing" compares."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def lease(run_dir: Path, run_id: str, node_rank: int = 0, said: list | None = None, **options) -> RunDirLease:
    return RunDirLease(
        run_dir,
        run_id,
        node_rank,
        options.pop("timeout", 60.0),
        say=(said.append if said is not None else lambda line: None),
        **options,
    )
