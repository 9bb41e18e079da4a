"""A rank's records file as types (trainstack/record.py): each line's round trip, its version, the lines a reader
skips or refuses, the split into launches and the steady window; and a rank's figures over that window
(trainstack/window.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from trainstack import record, window
from trainstack.errors import ConfigError
from trainstack.record import (
    RECORD_VERSION,
    IntervalRecord,
    Launch,
    Pause,
    SegmentEnded,
    SegmentStarted,
)
from trainstack.rundir import RunDir


def interval(step: int, **fields) -> IntervalRecord:
    """An interval of 10 steps of 0.1 s on a CPU rank, 0.01 s of it starved."""
    values: dict[str, Any] = {
        "time": 1000.0 + step,
        "rank": 0,
        "step": step,
        "epoch": 0,
        "loss": 2.0,
        "lr": 1e-3,
        "samples": 80,
        "tokens": 640,
        "interval_seconds": 1.0,
        "data_wait_seconds": 0.01,
        "step_seconds": (0.1,) * 10,
        "host_data_wait_seconds": 0.01,
        "clock": "host",
        "step_count": 10,
        "time_parts": {"compute": 0.99, "comm_exposed": 0.0, "data_starvation": 0.01, "host_bound": 0.0},
        "paused": (),
        "host_bound_measured": False,
    }
    return IntervalRecord(**values | fields)


def started(at: float = 900.0) -> SegmentStarted:
    return SegmentStarted(at, 0, "r", at - 1)


def write(run: RunDir, *lines: str | record.Line) -> None:
    run.telemetry.mkdir(parents=True, exist_ok=True)
    text = [line if isinstance(line, str) else line.to_json() for line in lines]
    run.rank_records(0).write_text("".join(f"{line}\n" for line in text))


def test_a_record_round_trips_and_leaves_out_what_it_did_not_measure():
    full = interval(
        10,
        loss=None,
        forward_seconds=0.3,
        comm_seconds=0.2,
        comm_exposed_seconds=0.05,
        comm_bytes=4000,
        comm_buckets=3,
        param_bytes=8,
        paused=(Pause("evaluation", 1.5, 4),),
        sm_active_ratio=0.5,
    )
    written = json.loads(full.to_json())
    assert written["version"] == RECORD_VERSION and written["step_seconds"] == [0.1] * 10
    assert written["loss"] is None and written["lr"] == 1e-3  # loss and lr: null, never absent
    assert written["paused"] == [{"part": "evaluation", "seconds": 1.5, "after_steps": 4}]
    assert "tensor_active_ratio" not in written and "grad_bytes" not in written  # unmeasured: absent
    assert record.parse(written, "here") == full
    plain = json.loads(interval(20).to_json())
    assert not {key for key in plain if key.startswith(("comm_", "forward", "sm_", "tensor_"))}
    for marker in (started(), SegmentEnded(950.0, 0, 3, (Pause("checkpoint_save", 2.0, 3),))):
        assert record.parse(json.loads(marker.to_json()), "here") == marker


def test_the_markers_keep_their_keys():
    assert json.loads(started().to_json()) == {
        "version": 1,
        "segment_started": 900.0,
        "rank": 0,
        "run_id": "r",
        "launched_at": 899.0,
    }
    ended = json.loads(SegmentEnded(950.0, 0, 3, ()).to_json())
    assert ended == {"version": 1, "segment_ended": 950.0, "rank": 0, "step_count": 3, "paused": []}


def test_a_line_without_a_version_is_version_1_and_reads_the_same(tmp_path):
    run = RunDir(tmp_path)
    old = {key: value for key, value in json.loads(interval(10).to_json()).items() if key != "version"}
    old_marker = {"segment_started": 900.0, "rank": 0, "run_id": "r", "launched_at": 899.0}
    write(run, json.dumps(old_marker), json.dumps(old))
    (launch,) = record.read_launches(run.rank_records(0))
    assert launch.started == started() and launch.records == [interval(10)]


def test_a_newer_record_is_refused_in_one_line(tmp_path):
    run = RunDir(tmp_path)
    write(run, started(), json.dumps(json.loads(interval(10).to_json()) | {"version": RECORD_VERSION + 1}))
    with pytest.raises(ConfigError, match=r"rank-0\.jsonl line 2 is a record of version 2, newer than") as raised:
        record.read_launches(run.rank_records(0))
    assert "upgrade trainstack" in str(raised.value) and "\n" not in str(raised.value)


def test_a_line_cut_off_by_a_kill_is_skipped_and_a_broken_record_refused(tmp_path):
    run = RunDir(tmp_path)
    write(run, started(), interval(10), interval(20).to_json()[:40], "[1, 2]", started(960.0), interval(30))
    first, second = record.read_launches(run.rank_records(0))
    assert (first.records, second.records) == ([interval(10)], [interval(30)])
    with run.rank_records(0).open("ab") as damaged:  # bytes the storage mangled: not UTF-8, no record
        damaged.write(b'{"time": \xff\xfe}\n')
    assert [launch.records for launch in record.read_launches(run.rank_records(0))] == [[interval(10)], [interval(30)]]
    write(run, started(), json.dumps({"time": 1.0, "step": 3}))
    with pytest.raises(ConfigError, match=r"line 2 is not a trainstack record \(TypeError: .*missing"):
        record.read_launches(run.rank_records(0))


def test_the_lines_split_into_launches_at_the_markers():
    ended = SegmentEnded(1100.0, 0, 0, ())
    lines = [interval(5), started(), interval(10), interval(20), ended, started(1200.0), interval(30)]
    before, exited, killed = record.launches(lines)
    assert (before.started, before.records, before.ended) == (None, [interval(5)], None)  # an older trainstack's
    assert (exited.started, exited.records, exited.ended) == (started(), [interval(10), interval(20)], ended)
    assert (killed.started, killed.records, killed.ended) == (started(1200.0), [interval(30)], None)
    assert record.records([before, exited, killed]) == [interval(s) for s in (5, 10, 20, 30)]


def test_the_steady_window_is_the_last_launchs_records_after_its_first():
    earlier = Launch(started(), [interval(10), interval(20), interval(30)])
    last = Launch(started(1200.0), [interval(40), interval(50), interval(60)])
    assert record.steady([earlier, last]) == [interval(50), interval(60)]
    assert record.steady([earlier, Launch(started(1200.0), [interval(40)])]) == []  # only its warm-up
    assert record.steady([]) == []


def test_a_ranks_figures_are_of_its_steady_window():
    warm_up = interval(10, data_wait_seconds=0.5, interval_seconds=5.0, comm_exposed_seconds=0.9)
    steady = [interval(20, comm_exposed_seconds=0.1), interval(30, comm_exposed_seconds=0.3)]
    found = window.of_rank(3, [Launch(started(), [warm_up, *steady])])
    assert found is not None and (found.rank, found.records, found.last) == (3, steady, steady[-1])
    assert found.step_count == 20 and found.stepped == pytest.approx(2.0)
    assert found.steps_per_second == pytest.approx(10.0) and found.samples_per_second == pytest.approx(80.0)
    assert found.data_wait_ratio == pytest.approx(0.01) and found.comm_exposed_ratio == pytest.approx(0.2)
    assert found.step_seconds == pytest.approx(0.1)
    assert found.forward_seconds is None  # no record of the window has it
    assert found.host_bound_ratio is None  # not measured (a CPU rank)
    one_without = window.of_rank(0, [Launch(None, [warm_up, steady[0], replace(steady[1], comm_exposed_seconds=None)])])
    assert one_without is not None and one_without.comm_exposed_ratio is None  # measured in each, or not at all
    measured = [replace(r, host_bound_measured=True, time_parts={"host_bound": 0.5}) for r in (warm_up, *steady)]
    gpu = window.of_rank(0, [Launch(None, measured)])
    assert gpu is not None and gpu.host_bound_ratio == pytest.approx(0.5)
    assert window.of_rank(0, [Launch(started(), [interval(10)]), Launch(started(1200.0))]) is None
