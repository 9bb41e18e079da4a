"""A Snapshot from a finished run's telemetry records (monitoring/diagnose/records.py): the last launch only, its
intervals after the first (warm-up), the verdicts diagnose gives on it, and the one ceiling per kind that both
they and summary.json carry."""

import json

import pytest

from trainstack import breakdown, ceilings
from trainstack.monitoring.diagnose.records import judged, snapshot_from_records
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.monitoring.report import render_report
from trainstack.record import SEGMENT_ENDED, SEGMENT_MARKER
from trainstack.rundir import RunDir
from trainstack.thresholds import Thresholds


def record(rank: int, step: int, exposed: float, forward: float, data_wait: float = 0.01) -> dict:
    """An interval of 10 steps of 0.1 s on a CPU rank."""
    return {
        "time": 1000.0 + step,
        "rank": rank,
        "step": step,
        "epoch": 0,
        "loss": 2.0,
        "lr": 1e-3,
        "samples": 80,
        "tokens": 0,
        "interval_seconds": 1.0,
        "data_wait_seconds": data_wait,
        "step_seconds": [0.1] * 10,
        "host_data_wait_seconds": data_wait,
        "clock": "host",
        "forward_seconds": forward,
        "comm_seconds": exposed + 0.05,
        "comm_exposed_seconds": exposed,
        "comm_bytes": 4000,
        "comm_buckets": 10,
        "step_count": 10,
        "time_parts": {
            "compute": 0.5,
            "comm_exposed": exposed,
            "data_starvation": data_wait,
            "host_bound": 0.0,
            "compile": 0.0,
        },
        "paused": [],
        "host_bound_measured": False,
    }


def write_run(run: RunDir, launches: dict[int, list[list[dict]]]) -> None:
    run.telemetry.mkdir(parents=True)
    for rank, segments in launches.items():
        lines = []
        for number, records in enumerate(segments):
            lines.append({SEGMENT_MARKER: 900.0 + number, "rank": rank, "run_id": "r", "launched_at": 900.0})
            lines += records
            lines.append({SEGMENT_ENDED: 2000.0, "rank": rank, "step_count": 0, "paused": []})
        run.rank_records(rank).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_last_launch_after_its_first_interval_is_judged(tmp_path):
    run = RunDir(tmp_path)
    # An earlier launch where rank 0 was the straggler; in the last one rank 1 is: rank 0 waits 0.3 s of each 1 s
    # interval at the collectives, rank 1 0.02 s. Each launch's first interval (warm-up) says the opposite.
    earlier = {0: [record(0, s, 0.0, 0.3) for s in (10, 20, 30)], 1: [record(1, s, 0.3, 0.1) for s in (10, 20, 30)]}
    last = {
        0: [record(0, 40, 0.0, 0.1)] + [record(0, s, 0.3, 0.1, data_wait=0.01) for s in (50, 60)],
        1: [record(1, 40, 0.3, 0.1)] + [record(1, s, 0.02, 0.38, data_wait=0.01) for s in (50, 60)],
    }
    write_run(run, {rank: [earlier[rank], last[rank]] for rank in (0, 1)})
    snapshot = snapshot_from_records(tmp_path)
    assert "records in" in snapshot.source and snapshot.now == 1060.0
    peer, slow = snapshot.ranks
    assert (peer.rank, peer.steps, peer.world_size, peer.clock) == ("0", 60.0, 2, "host")
    assert peer.step_seconds == pytest.approx(0.1) and peer.steps_per_second == pytest.approx(10.0)
    assert (peer.comm_exposed_ratio, slow.comm_exposed_ratio) == (pytest.approx(0.3), pytest.approx(0.02))
    assert (peer.forward_seconds, slow.forward_seconds) == (pytest.approx(0.01), pytest.approx(0.038))
    assert peer.comm_seconds == pytest.approx(0.035) and peer.comm_bytes_per_step == pytest.approx(400)
    assert peer.data_wait_ratio == pytest.approx(0.01) and peer.host_bound_ratio is None
    verdicts = diagnose(snapshot, Thresholds())
    assert [v.kind for v in verdicts] == ["straggler"]
    assert verdicts[0].summary.startswith(
        "rank 1 is a straggler: the other rank(s) wait for it 28 ms of each 100 ms step"
    )


def test_a_runs_ceilings_are_its_verdicts_one_per_kind_over_the_steady_window(tmp_path):
    run = RunDir(tmp_path)
    # As above: the earlier launch and each launch's first interval name the other rank. Every record over every
    # launch would give another straggler share; the steady window gives the verdict's.
    earlier = {0: [record(0, s, 0.0, 0.3) for s in (10, 20, 30)], 1: [record(1, s, 0.3, 0.1) for s in (10, 20, 30)]}
    last = {
        0: [record(0, 40, 0.0, 0.1)] + [record(0, s, 0.3, 0.1) for s in (50, 60)],
        1: [record(1, 40, 0.3, 0.1)] + [record(1, s, 0.02, 0.38) for s in (50, 60)],
    }
    write_run(run, {rank: [earlier[rank], last[rank]] for rank in (0, 1)})
    found = ceilings.as_json(ceilings.of_run(tmp_path, breakdown.of_run(tmp_path)))  # summary.json's `ceilings`
    (verdict,) = judged(tmp_path)
    assert verdict["kind"] == "straggler" and verdict["ceiling"] == found["straggler"]
    assert found["straggler"]["share"] == pytest.approx(0.28)
    assert found["comm-bound"]["share"] == pytest.approx(0.02) and found["input-bound"]["share"] == pytest.approx(0.01)
    assert set(found) == {"input-bound", "comm-bound", "straggler", "pauses"}


def test_a_loop_without_a_ddp_model_has_no_waits_and_no_straggler(tmp_path):
    run = RunDir(tmp_path)
    unwatched = {
        rank: [
            [
                {
                    key: value
                    for key, value in record(rank, s, 0.0, 0.1 + 0.3 * rank).items()
                    if not key.startswith("comm_")
                }
                for s in (10, 20)
            ]
        ]
        for rank in (0, 1)
    }
    write_run(run, unwatched)
    snapshot = snapshot_from_records(run)
    assert [r.comm_exposed_ratio for r in snapshot.ranks] == [None, None]
    assert snapshot.straggler_waits() == {}
    assert "straggler" not in [v.kind for v in diagnose(snapshot, Thresholds())]


def test_a_finished_run_is_judged_with_each_verdicts_ceiling_and_shown_in_its_report(tmp_path):
    run = RunDir(tmp_path)
    records = {0: [record(0, s, 0.3, 0.1) for s in (10, 20, 30)], 1: [record(1, s, 0.02, 0.38) for s in (10, 20, 30)]}
    write_run(run, {rank: [records[rank]] for rank in (0, 1)})
    verdicts = judged(tmp_path)
    assert [v["kind"] for v in verdicts] == ["straggler"]
    assert verdicts[0]["ceiling"]["kind"] == "straggler"
    assert verdicts[0]["ceiling"]["speedup"] == pytest.approx(1 / (1 - 0.28))  # what rank 0 waits beyond rank 1
    run.summary.write_text(json.dumps({"version": 1, "run_id": "r", "exit_reason": "completed", "verdicts": verdicts}))
    page = render_report(tmp_path).read_text()
    verdicts_table = page.split("<h2>Verdicts</h2>", 1)[1].split("</table>", 1)[0]
    assert "rank 1 is a straggler" in verdicts_table and "up to 1.39x faster" in verdicts_table


def test_a_run_no_rank_recorded_is_not_judged(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"version": 1, "command": "python train.py"}))
    assert judged(tmp_path) is None  # nothing judged, which an empty list (healthy) would hide
