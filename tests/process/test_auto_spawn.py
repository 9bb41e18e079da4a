"""`trainstack watch` instruments ranks started by `torch.multiprocessing.spawn` (tests/drivers/spawn_ddp.py), as
PyTorch's DDP tutorial starts them: children of one `python script.py` that set no RANK and join their process group
themselves. The rule that tells them from DataLoader workers, also multiprocessing children: a rank has joined a
process group by its first training step (trainstack/auto/instrument.py, is_rank)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.runs import REPO, explain, run_trainstack
from trainstack.record import read_launches
from trainstack.rundir import RunDir, free_port

pytestmark = pytest.mark.slow

DRIVER = str(REPO / "tests" / "drivers" / "spawn_ddp.py")
STEPS = 40


def _watched(run_dir) -> dict:
    """The driver under `trainstack watch`: its summary.json."""
    done = run_trainstack(
        "watch",
        "--run-dir",
        str(run_dir),
        "--exporter-port",
        "0",
        "--no-report",
        "--",
        sys.executable,
        DRIVER,
        str(STEPS),
        str(free_port()),
        env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"},
    )
    assert done.returncode == 0, explain(done)
    return json.loads(RunDir(run_dir).summary.read_text())


def test_spawned_ranks_are_recorded_and_judged(tmp_path):
    summary = _watched(tmp_path / "run")
    assert summary["judged"] is True, summary
    assert summary["verdicts"] == [], summary["verdicts"]
    run = RunDir(tmp_path / "run")
    assert sorted(run.all_rank_records()) == [0, 1]  # each rank under the rank it gave init_process_group
    for rank in (0, 1):
        (launch,) = read_launches(run.rank_records(rank))
        assert launch.records[-1].step == STEPS and launch.ended is not None
