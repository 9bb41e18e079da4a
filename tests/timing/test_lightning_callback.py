"""Lightning's Trainer with trainstack's callback under `trainstack watch` on 2 CPU ranks (gloo), on tests/drivers/
lightning_example.py: `Trainer(strategy="ddp", accelerator="cpu", devices=2)`, a BatchNorm model over token ids,
gradient accumulation, validations and checkpoints. Launched by torchrun and by Lightning itself (`python
script.py`): one launch each, three phases (healthy; rank 1 slowed after its micro-batches; a slow loader on both
ranks), judged from each phase's records as `trainstack diagnose` judges a finished run (the callback in one
process: tests/unit/trainstack/test_lightning_callback.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.runs import REPO, torchrun, trainstack_command
from trainstack.monitoring.diagnose.finished import judged

DRIVER = REPO / "tests" / "drivers" / "lightning_example.py"


# ---- 2 ranks under trainstack watch ---------------------------------------------------------------------------
@dataclass
class Launch:
    run: Path
    """The watched run's directory: its records in telemetry/rank-<r>.jsonl."""
    expected: dict
    log: str

    def records(self, rank: int) -> list[dict]:
        path = self.run / "telemetry" / f"rank-{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def intervals(self, rank: int) -> list[dict]:
        return [record for record in self.records(rank) if "step" in record]

    def phase(self, name: str, folder: Path) -> Path:
        """A run directory holding only the phase's records (the interval that starts it is the first, which the
        judging leaves out as it leaves out a run's first)."""
        ends = self.expected["phases"]
        names = list(ends)
        begins = 0 if names.index(name) == 0 else ends[names[names.index(name) - 1]]
        (folder / "telemetry").mkdir(parents=True)
        for rank in (0, 1):
            records = self.records(rank)
            kept = [records[0]] + [r for r in records if "step" in r and begins < r["step"] <= ends[name]]
            text = "".join(json.dumps(record) + "\n" for record in kept)
            (folder / "telemetry" / f"rank-{rank}.jsonl").write_text(text)
        return folder


def launch(folder: Path, *command: str) -> Launch:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("TRAINSTACK_RUN_DIR", None)
    done = subprocess.run(
        trainstack_command("watch", "--run-dir", str(folder / "run"), "--exporter-port", "0", "--no-report", "--")
        + list(command),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    return Launch(folder / "run", json.loads((folder / "expected.json").read_text()), log)


LAUNCHERS = {
    "torchrun": lambda out: torchrun(str(DRIVER), str(out)),
    "lightning": lambda out: [sys.executable, str(DRIVER), str(out)],  # Lightning starts rank 1 itself
}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def launched(request, tmp_path_factory) -> Launch:
    out = tmp_path_factory.mktemp(f"lightning-{request.param}")
    return launch(out, *LAUNCHERS[request.param](out))


@pytest.mark.slow
@pytest.mark.timing  # shares the launch of the healthy phase below, which needs the cores to itself
def test_every_rank_records_each_optimizer_step_with_all_its_micro_batches(launched):
    expected = launched.expected
    for rank in (0, 1):
        records = launched.records(rank)
        assert records[0]["rank"] == rank
        intervals = launched.intervals(rank)
        assert [r["step"] for r in intervals] == [1] + list(
            range(expected["log_every"], expected["steps"] + 1, expected["log_every"])
        )
        # Optimizer steps, not micro-batches: each step carries both micro-batches' samples and tokens.
        assert sum(r["step_count"] for r in intervals) == expected["steps"]
        assert {r["samples"] / r["step_count"] for r in intervals} == {expected["samples_per_step"]}
        assert {r["tokens"] / r["step_count"] for r in intervals} == {expected["tokens_per_step"]}
        assert {r["lr"] for r in intervals} == {0.05}
        assert all(r["forward_seconds"] > 0 and r["comm_seconds"] > 0 for r in intervals)  # DDP's model


@pytest.mark.slow
@pytest.mark.timing  # shares the launch of the healthy phase below
def test_validations_and_checkpoint_saves_are_pauses_after_their_steps(launched):
    expected = launched.expected
    for rank in (0, 1):
        pauses: dict[str, list[int]] = {"evaluation": [], "checkpoint_save": []}
        last_step = 0
        for record in launched.records(rank):
            for pause in record.get("paused", []):
                if pause["part"] in pauses:
                    pauses[pause["part"]].append(last_step + pause["after_steps"])
            last_step = record.get("step", last_step)
        assert pauses == {"evaluation": expected["validations"], "checkpoint_save": expected["saves"]}


@pytest.mark.slow
@pytest.mark.timing  # healthy means ranks at one speed: another test's ranks on the same cores make a straggler
def test_a_healthy_phase_gets_no_verdict_and_a_slow_loader_reads_input_bound(launched, tmp_path):
    assert judged(launched.phase("healthy", tmp_path / "healthy")) == []
    slow = judged(launched.phase("slow-loader", tmp_path / "slow-loader"))
    assert [verdict["kind"] for verdict in slow] == ["input-bound"]


@pytest.mark.slow
@pytest.mark.timing
def test_a_rank_waiting_for_a_slow_peer_at_the_stop_flag_broadcast_names_the_peer_and_is_not_input_bound(
    launched, tmp_path
):
    # Lightning broadcasts its stop flag before each fetch: rank 0 waits there for rank 1, and none of it is the
    # fetch's. Its data wait stays the fetch's few milliseconds; the wait is at a collective (trainstack/telemetry/
    # collectives.py), so rank 1 is the straggler.
    verdicts = judged(launched.phase("straggler", tmp_path / "straggler"))
    assert verdicts is not None
    assert "input-bound" not in [verdict["kind"] for verdict in verdicts]
    named = [verdict["summary"] for verdict in verdicts if verdict["kind"] == "straggler"]
    assert len(named) == 1 and named[0].startswith("rank 1 is a straggler:"), verdicts
    ends = launched.expected["phases"]
    waits = [
        r["data_wait_seconds"] / r["interval_seconds"]
        for r in launched.intervals(0)
        if ends["healthy"] < r["step"] <= ends["straggler"]
    ]
    assert waits and max(waits) < 0.1, waits
