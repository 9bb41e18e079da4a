"""The straggler is named where the ranks wait for each other (docs/diagnostics.md, "How trainstack finds a
straggler"): 2 CPU ranks over gloo, one rank given real extra work in its forward pass, after its optimizer step or
in its loader, on a model with buffers (DDP broadcasts them in every forward pass, or not) and on one without.
Every phase runs in one launch (tests/drivers/straggler_matrix.py) and is judged from its records; a phase judged
wrong is judged again in up to two launches of its own (tests/helpers/runs.py, HEALTHY_RELAUNCHES)."""

import itertools
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.runs import REPO, checked_while_failing, torchrun
from trainstack.monitoring.diagnose import verdicts
from trainstack.monitoring.diagnose.finished import snapshot_from_records
from trainstack.thresholds import Thresholds

DRIVER = REPO / "tests" / "drivers" / "straggler_matrix.py"


def launch(out: Path, *names: str) -> Path:
    """The driver run once, its records in `out`: the phases `names`, every phase by default."""
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    env.pop("TRAINSTACK_RUN_DIR", None)
    done = subprocess.run(
        torchrun(str(DRIVER), str(out), *names),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def phases(tmp_path_factory) -> tuple[Path, dict]:
    out = launch(tmp_path_factory.mktemp("straggler-matrix"))
    return out, json.loads((out / "phases.json").read_text())


def holds_in_a_launch(first: Path, names: tuple[str, ...], check: Callable[[Path], None], folder: Path) -> None:
    """`check` on the records of the first launch, then of launches of the phases `names` alone, up to
    HEALTHY_RELAUNCHES more, while it fails: a 2-vCPU host can take CPU from one rank for a whole phase."""
    launches = itertools.chain(
        [first], (launch(folder / f"{'+'.join(names)}-again-{n}", *names) for n in itertools.count())
    )
    failures = checked_while_failing(lambda: check(next(launches)))
    assert failures[-1] == "", f"{names}: every launch failed: {failures}"


def _judged(out: Path, name: str):
    snapshot = snapshot_from_records(out / name)
    return snapshot, [v for v in verdicts.diagnose(snapshot, Thresholds()) if v.kind == "straggler"]


@pytest.mark.slow
@pytest.mark.timing
def test_the_slowed_rank_is_named_with_its_peers_wait_as_the_cost(phases, tmp_path):
    out, matrix = phases
    extra = matrix["extra_seconds"]
    slowed = [phase for phase in matrix["phases"] if phase["slow_in"]]
    assert {(p["buffers"], p["broadcast_buffers"], p["slow_in"]) for p in slowed} >= {
        (buffers, broadcast, where)
        for buffers, broadcast in ((True, True), (True, False), (False, True))
        for where in ("forward", "after_step", "data")
    }
    for phase in slowed:

        def named_at_its_cost(records: Path, phase=phase) -> None:
            snapshot, named = _judged(records, phase["name"])
            assert len(named) == 1, (phase["name"], named)
            assert named[0].summary.startswith(f"rank {phase['slow_rank']} is a straggler:"), (phase["name"], named)
            waits = snapshot.straggler_waits()
            longest = max(r.step_seconds for r in snapshot.ranks)  # the base of ratios.STRAGGLER_WAIT's shares
            cost = waits[str(phase["slow_rank"])] * longest
            assert cost == pytest.approx(extra, rel=0.2), (phase["name"], cost, extra)

        holds_in_a_launch(out, (phase["name"],), named_at_its_cost, tmp_path)


@pytest.mark.slow
@pytest.mark.timing
def test_a_wait_at_the_loops_own_collective_or_after_a_pre_hook_names_the_straggler_and_nothing_else(phases, tmp_path):
    """The peer waits for the slowed rank at the loop's all-reduce of its metric, or (the slowed rank's own
    forward pre-hook working) at the next broadcast and gradient all-reduce: that is its wait at the collectives,
    never data wait, and the pre-hook's work is the slowed rank's forward, not the broadcast (issue 43)."""
    out, matrix = phases
    slowed = {p["name"]: p for p in matrix["phases"] if p["slow_in"] in ("metric", "pre_hook")}
    assert set(slowed) == {"plain-metric", "buffers-pre_hook"}
    for name, phase in slowed.items():

        def the_straggler_alone(records: Path, name=name, phase=phase) -> None:
            snapshot = snapshot_from_records(records / name)
            every = verdicts.diagnose(snapshot, Thresholds())
            assert [v.kind for v in every] == ["straggler"], (name, every)
            assert every[0].summary.startswith(f"rank {phase['slow_rank']} is a straggler:"), (name, every)
            peer, slow = snapshot.ranks
            assert peer.data_wait_ratio is not None and peer.data_wait_ratio < 0.1, (name, peer.data_wait_ratio)
            if phase["slow_in"] == "pre_hook":
                extra = matrix["extra_seconds"]
                assert slow.forward_seconds - peer.forward_seconds == pytest.approx(extra, rel=0.3)

        holds_in_a_launch(out, (name,), the_straggler_alone, tmp_path)


@pytest.mark.slow
@pytest.mark.timing
def test_a_healthy_run_names_no_straggler(phases, tmp_path):
    out, matrix = phases
    healthy = [phase["name"] for phase in matrix["phases"] if not phase["slow_in"]]
    assert len(healthy) == 3
    for name in healthy:

        def no_straggler(records: Path, name=name) -> None:
            snapshot, named = _judged(records, name)
            assert len(snapshot.straggler_waits()) == 2, name  # both ranks' waits are measured, and judged
            assert named == [], (name, named)

        holds_in_a_launch(out, (name,), no_straggler, tmp_path)


@pytest.mark.slow
@pytest.mark.timing
def test_the_buffer_broadcast_is_communication_not_forward_time(phases, tmp_path):
    """With one rank slowed in its forward pass, its peer waits in the buffer broadcast at the start of its own
    forward pass: that wait counts as exposed communication, and the peer's forward time stays its own."""
    out, matrix = phases
    assert {p["name"]: p["slow_rank"] for p in matrix["phases"]}["buffers-forward"] == 1

    def broadcast_is_communication(records: Path) -> None:
        broadcast = snapshot_from_records(records / "buffers-forward")
        unbroadcast = snapshot_from_records(records / "no-broadcast-forward")
        for snapshot in (broadcast, unbroadcast):
            peer, slow = snapshot.ranks
            assert slow.forward_seconds - peer.forward_seconds == pytest.approx(matrix["extra_seconds"], rel=0.3)
        buffers_bytes = [r.comm_bytes_per_step for r in broadcast.ranks]
        unbroadcast_bytes = [r.comm_bytes_per_step for r in unbroadcast.ranks]
        assert all(with_b > without for with_b, without in zip(buffers_bytes, unbroadcast_bytes, strict=True))

    holds_in_a_launch(out, ("buffers-forward", "no-broadcast-forward"), broadcast_is_communication, tmp_path)
