"""`trainstack watch` instruments ranks started by `torch.multiprocessing.spawn` (tests/drivers/spawn_ddp.py), as
PyTorch's DDP tutorial starts them: children of one `python script.py` that set no RANK and join their process group
themselves. The rule that tells them from DataLoader workers, also multiprocessing children: a rank has joined a
process group by its first training step (trainstack/auto/instrument.py, is_rank)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.drivers.plain_ddp import BATCH
from tests.helpers.runs import REPO, explain, judged_while_unhealthy, run_watched
from trainstack.record import read_launches
from trainstack.rundir import RunDir, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timing]

DRIVER = str(REPO / "tests" / "drivers" / "spawn_ddp.py")
STEPS = 40


def _watched(run_dir) -> dict:
    """The driver under `trainstack watch`: its summary.json."""
    done = run_watched(
        run_dir,
        sys.executable,
        DRIVER,
        str(STEPS),
        str(free_port()),
        env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"},
    )
    assert done.returncode == 0, explain(done)
    return json.loads(RunDir(run_dir).summary.read_text())


def test_spawned_ranks_are_recorded_and_judged_healthy(tmp_path):
    """A healthy loop: no verdict in its summary.json, judged again in up to HEALTHY_RELAUNCHES more launches where
    the first gives one (here, not beside another test's ranks: CI once saw one spawned rank's forward 18% slower
    there, and that rank named)."""
    runs: list[Path] = []

    def watched() -> dict:
        runs.append(tmp_path / f"run-{len(runs)}")
        return _watched(runs[-1])

    summaries = judged_while_unhealthy(watched, lambda summary: not summary["verdicts"])
    summary, run = summaries[-1], RunDir(runs[-1])
    assert summary["judged"] is True, summary
    assert summary["verdicts"] == [], f"every launch gave a verdict: {[s['verdicts'] for s in summaries]}"
    assert sorted(run.all_rank_records()) == [0, 1]  # each rank under the rank it gave init_process_group
    for rank in (0, 1):
        (launch,) = read_launches(run.rank_records(rank))
        assert launch.records[-1].step == STEPS and launch.ended is not None
        assert sum(record.samples for record in launch.records) == STEPS * BATCH
        # DDP's all-reduce and the forward passes timed in the spawned child, each interval
        assert all(record.comm_seconds is not None and record.forward_seconds for record in launch.records)
