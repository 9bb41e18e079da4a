"""Ceilings (trainstack/ceilings.py): the speedup a verdict's fix can bring at most, 1 / (1 - share), from ranks'
shares, breakdowns and snapshots whose answer is known; diagnose prints it beside the verdict and in --json."""

from __future__ import annotations

import json

import pytest

from trainstack import breakdown, ceilings
from trainstack.monitoring.diagnose.render import render_json, render_text
from trainstack.monitoring.diagnose.snapshot import RankView, Snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose, figures
from trainstack.thresholds import Thresholds


@pytest.mark.parametrize(("share", "speedup"), [(0.0, 1.0), (0.12, 1.136), (0.31, 1.449), (0.4, 1.667), (0.5, 2.0)])
def test_the_ceiling_is_one_over_the_time_left(share, speedup):
    assert ceilings.speedup_ceiling(share) == pytest.approx(speedup, abs=1e-3)


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5])
def test_a_share_outside_zero_to_one_has_no_ceiling(share):
    with pytest.raises(ValueError, match="share"):
        ceilings.speedup_ceiling(share)


def _rank(
    rank: int,
    compute: float,
    comm: float,
    starved: float,
    host: float = 0.0,
    host_measured: bool = False,
    **pauses: float,
) -> dict:
    seconds = dict.fromkeys(breakdown.PARTS, 0.0)
    seconds.update(
        {
            breakdown.COMPUTE: compute,
            breakdown.COMM_EXPOSED: comm,
            breakdown.DATA_STARVATION: starved,
            breakdown.HOST_BOUND: host,
            **pauses,
        }
    )
    return {
        "rank": rank,
        "wall_seconds": sum(seconds.values()),
        "seconds": seconds,
        "host_bound_measured": host_measured,
    }


def _times(*ranks: dict) -> dict:
    wall = sum(rank["wall_seconds"] for rank in ranks)
    return {
        "wall_seconds": wall,
        "ranks": list(ranks),
        "seconds": {part: sum(rank["seconds"][part] for rank in ranks) for part in breakdown.PARTS},
    }


def test_each_kind_reads_its_own_share_of_the_ranks_and_the_pauses_of_the_breakdown():
    # Rank 0 starves 31% of its 10 s of steps and waits 1 s on communication; rank 1, its peer, waits 3 s for it.
    times = _times(
        _rank(0, compute=5.9, comm=1.0, starved=3.1, evaluation=2.0),
        _rank(1, compute=7.0, comm=3.0, starved=0.0, checkpoint_save=2.0),
    )
    ranks = [
        RankView(rank="0", data_wait_ratio=0.31, comm_exposed_ratio=0.1, step_seconds=1.0),
        RankView(rank="1", data_wait_ratio=0.0, comm_exposed_ratio=0.3, step_seconds=1.0),
    ]
    found = {**ceilings.of_ranks(ranks), **ceilings.of_pauses(times)}
    assert found["input-bound"].share == pytest.approx(0.31)
    assert found["input-bound"].speedup == pytest.approx(1.449, abs=1e-3)
    assert "starves the device 31% of step time" in found["input-bound"].text
    assert "up to 1.45x faster" in found["input-bound"].text
    assert found["comm-bound"].share == pytest.approx(0.1)  # the least exposed rank
    assert found["straggler"].share == pytest.approx(0.2)  # rank 1 waits 3 s of 10, beyond rank 0's 1 s
    assert found["pauses"].share == pytest.approx(4.0 / 24.0)
    assert "host-bound" not in found  # CPU ranks do not measure it


def test_host_bound_counts_where_a_rank_measured_it():
    times = _times(_rank(0, compute=6.0, comm=0.0, starved=0.0, host=4.0, host_measured=True))
    found = {
        **ceilings.of_ranks([RankView(rank="0", data_wait_ratio=0.0, host_bound_ratio=0.4)]),
        **ceilings.of_pauses(times),
    }
    assert found["host-bound"].speedup == pytest.approx(1 / 0.6)
    assert set(found) == {"input-bound", "host-bound", "pauses"}  # one rank: nothing to wait for


def test_no_breakdown_no_ceilings():
    assert ceilings.of_pauses(None) == {} and ceilings.of_ranks([]) == {}


def _snapshot(*ranks: RankView) -> Snapshot:
    return Snapshot("test", 1000.0, list(ranks))


def test_diagnose_prints_the_ceiling_beside_the_verdict_it_caps():
    ranks = [
        RankView(
            rank=str(r),
            steps=50,
            steps_per_second=2.0,
            step_seconds=0.5,
            data_wait_ratio=wait,
            comm_exposed_ratio=0.05,
            forward_seconds=0.1,
            last_step_time=999.0,
        )
        for r, wait in ((0, 0.40), (1, 0.05))
    ]
    snapshot = _snapshot(*ranks)
    verdicts = diagnose(snapshot, Thresholds())
    assert [v.kind for v in verdicts] == ["input-bound"]
    found = ceilings.of_ranks(snapshot.ranks)
    text = render_text("test", verdicts, figures(snapshot), (), found)
    assert (
        "ceiling: input-bound: the loader starves the device 40% of step time; a loader that keeps up makes "
        "steps up to 1.67x faster" in text
    )
    judged = json.loads(render_json("test", verdicts, figures(snapshot), (), found))["verdicts"]
    assert judged[0]["ceiling"]["speedup"] == pytest.approx(1 / 0.6)


def test_a_live_straggler_ceiling_is_what_its_peers_wait_beyond_it():
    # Rank 0 is slow: rank 1 waits for it at the all-reduce 30% of its step, rank 0 itself 5%.
    ranks = [
        RankView(rank=str(r), step_seconds=1.0, forward_seconds=0.1, comm_exposed_ratio=wait)
        for r, wait in ((0, 0.05), (1, 0.30))
    ]
    snapshot = _snapshot(*ranks)
    found = ceilings.of_ranks(snapshot.ranks)
    assert found["straggler"].share == pytest.approx(0.25)
    assert found["straggler"].speedup == pytest.approx(1 / 0.75)
    (straggler,) = (v for v in diagnose(snapshot, Thresholds()) if v.kind == "straggler")
    assert straggler.summary.startswith("rank 0 is a straggler: the other rank(s) wait for it 250 ms")  # one figure
