"""Where each rank's time goes (trainstack/breakdown.py): a step's split, the records' sums with lost progress, and
the rank's side (trainstack/telemetry/, gpu_busy.py) on the CPU and on a fake GPU with stand-in NVML samples. The
2-rank runs are in tests/process/test_train_breakdown.py."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml
import pytest
import torch

from tests.helpers.fakes import FakeGpu, identity
from trainstack import breakdown, ceilings, record
from trainstack.breakdown import (
    BETWEEN_SEGMENTS,
    COMPUTE,
    LOST_PROGRESS,
    OTHER,
    Spent,
    rank_segments,
    redone_after,
    run_breakdown,
    segment_seconds,
    split_step_time,
)
from trainstack.monitor import Monitor
from trainstack.problems import PAUSES
from trainstack.record import SEGMENT_ENDED, SEGMENT_MARKER
from trainstack.rundir import RunDir, read_json_lines
from trainstack.telemetry.gpu_busy import GpuBusy

# --- the arithmetic -------------------------------------------------------------------------------------------


def test_a_steps_time_splits_into_parts_that_add_up_to_it():
    parts = split_step_time(10.0, data_starvation=1.0, comm_exposed=2.0, busy_share=0.7)
    # idle 3 s, of which starvation explains 1: the host's 2; compute the remaining 5
    assert parts == pytest.approx({"compute": 5.0, "comm_exposed": 2.0, "data_starvation": 1.0, "host_bound": 2.0})
    assert sum(parts.values()) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("busy", "host_bound", "compute"),
    [
        (None, 0.0, 7.0),  # a CPU rank, or no NVML sample: not measured
        (1.0, 0.0, 7.0),  # never idle
        (0.95, 0.0, 7.0),  # idle less than it starved: the idle time is the starvation
        (0.0, 7.0, 0.0),  # idle throughout: what is neither starvation nor exposed communication is the host's
    ],
)
def test_host_bound_idle_is_the_idle_time_starvation_does_not_explain(busy, host_bound, compute):
    parts = split_step_time(10.0, data_starvation=1.0, comm_exposed=2.0, busy_share=busy)
    assert (parts["host_bound"], parts["compute"]) == pytest.approx((host_bound, compute))


def marker(launched_at: float) -> dict:
    return {SEGMENT_MARKER: launched_at + 1, "rank": 0, "run_id": "r", "launched_at": launched_at}


def interval(time_: float, step: int, steps: int, compute: float, paused: list[dict] = ()) -> dict:
    return {
        "time": time_,
        "rank": 0,
        "step": step,
        "epoch": 0,
        "loss": 2.0,
        "lr": 0.1,
        "samples": 8 * steps,
        "tokens": 0,
        "interval_seconds": 10.0,
        "data_wait_seconds": 1.0,
        "step_seconds": [compute / steps + 0.2] * steps,
        "step_count": steps,
        "host_bound_measured": False,
        "paused": list(paused),
        "time_parts": {
            "compute": compute,
            "comm_exposed": 1.0,
            "data_starvation": 1.0,
            "host_bound": 0.0,
            "compile": 0.0,
        },
    }


def segments(lines: list[dict]) -> list[breakdown.SegmentTimes]:
    """A rank's records file, given as its lines, as its segments' times."""
    return rank_segments(record.launches(filter(None, (record.parse(line, "a test line") for line in lines))))


def pause(part: str, seconds: float, after_steps: int = 0) -> dict:
    return {"part": part, "seconds": seconds, "after_steps": after_steps}


# A launch trained steps 1-20 and saved step 10 (and evaluated at 15) before it was killed; the next resumed from
# step 10, trained 11-20 again and exited. Every second of both launches is in some part.
KILLED_THEN_RESUMED = [
    marker(1000.0),
    interval(1010.0, 10, 10, 6.0, [pause("startup", 2.0)]),
    interval(1020.0, 20, 10, 6.0, [pause("checkpoint_save", 1.0), pause("evaluation", 1.0, after_steps=5)]),
    marker(1030.0),
    interval(1045.0, 20, 10, 8.0, [pause("startup", 3.0), pause("checkpoint_load", 2.0)]),
    {SEGMENT_ENDED: 1050.0, "rank": 0, "step_count": 0, "paused": [pause("checkpoint_save", 5.0)]},
]


def test_steps_a_later_launch_trained_again_are_lost_progress():
    killed, resumed = segments(KILLED_THEN_RESUMED)
    assert (killed.resumed_from, killed.closed, killed.wall_seconds) == (0, False, 20.0)  # to its last record
    assert (resumed.resumed_from, resumed.closed, resumed.wall_seconds) == (10, True, 20.0)
    assert redone_after([killed, resumed]) == [10, None]
    lost = segment_seconds(killed, 10)
    # steps 11-20 (8 s) and the evaluation at step 15; the checkpoint of step 10, which the next launch loaded, is kept
    assert lost[LOST_PROGRESS] == 9.0
    assert (lost["checkpoint_save"], lost["evaluation"], lost[COMPUTE], lost["startup"]) == (1.0, 0.0, 6.0, 2.0)
    assert lost[OTHER] == 0.0
    kept = segment_seconds(resumed, None)
    assert (kept[LOST_PROGRESS], kept["checkpoint_load"], kept["checkpoint_save"], kept[OTHER]) == (0.0, 2.0, 5.0, 0.0)


def test_an_interval_straddling_the_resumed_checkpoint_loses_its_later_steps_share():
    spent = Spent(COMPUTE, 8.0, first_step=10, last_step=20)
    assert (spent.lost_share(15), spent.lost_share(20), spent.lost_share(5), spent.lost_share(None)) == (
        0.5,
        0.0,
        1.0,
        0.0,
    )
    assert Spent("evaluation", 1.0, 15, 15).lost_share(15) == 0.0  # a pause at the checkpoint's own step is kept


def test_the_earliest_later_resume_decides_what_was_trained_again():
    found = segments(
        [
            marker(0.0),
            interval(5.0, 20, 20, 1.0),
            marker(10.0),
            interval(15.0, 30, 10, 1.0),
            marker(20.0),
            interval(25.0, 12, 2, 1.0),
        ]
    )
    assert [s.resumed_from for s in found] == [0, 20, 10]
    assert redone_after(found) == [10, 10, None]  # the third launch resumed behind the second one's start


def test_the_run_sums_ranks_and_segments_and_goodput_is_computes_share_of_wall_time():
    lines = {0: segments(KILLED_THEN_RESUMED), 1: segments(KILLED_THEN_RESUMED)}
    times = run_breakdown(lines)
    assert times["parts"] == list(breakdown.PARTS)
    # Each rank: two launches of 20 s, and 10 s between the killed one's last record and the next launch.
    assert times["wall_seconds"] == 100.0 and times["goodput"] == (6.0 + 8.0) * 2 / 100.0
    assert [r["rank"] for r in times["ranks"]] == [0, 1]
    assert [s["ended"] for s in times["ranks"][0]["segments"]] == ["killed", "exited"]
    first, second = times["segments"]
    assert first["wall_seconds"] == 40.0 and first["seconds"][LOST_PROGRESS] == 18.0
    assert (second["wall_seconds"], second["seconds"][BETWEEN_SEGMENTS]) == (60.0, 20.0)
    assert times["seconds"][BETWEEN_SEGMENTS] == 20.0
    assert sum(times["seconds"].values()) == pytest.approx(times["wall_seconds"])


def requeued(wait: float) -> list[dict]:
    """A rank of a job that trained steps 1-10, checkpointed and exited 75, waited `wait` seconds in the queue and
    trained steps 11-20 in its second segment."""
    return [
        marker(0.0),
        interval(10.0, 10, 10, 4.0, [pause("startup", 2.0), pause("checkpoint_save", 2.0)]),
        {SEGMENT_ENDED: 10.0, "rank": 0, "step_count": 0, "paused": []},
        marker(10.0 + wait),
        interval(20.0 + wait, 20, 10, 4.0, [pause("startup", 2.0), pause("checkpoint_load", 2.0)]),
        {SEGMENT_ENDED: 20.0 + wait, "rank": 0, "step_count": 0, "paused": []},
    ]


def test_the_time_a_requeued_job_waits_between_its_segments_is_its_own_part_and_lowers_goodput():
    straight = run_breakdown({0: segments(requeued(0.0))})
    waited = run_breakdown({0: segments(requeued(30.0))})
    assert waited["seconds"][BETWEEN_SEGMENTS] == 30.0 and straight["seconds"][BETWEEN_SEGMENTS] == 0.0
    assert waited["wall_seconds"] == straight["wall_seconds"] + 30.0 == 50.0  # the first launch to the last exit
    assert waited["goodput"] == 8.0 / 50.0 < straight["goodput"] == 8.0 / 20.0
    # The wait belongs to the segment it waited for; neither launch's own parts change, `other` stays 0.
    rows = waited["ranks"][0]["segments"]
    assert [row["seconds"][BETWEEN_SEGMENTS] for row in rows] == [0.0, 30.0]
    assert [row["wall_seconds"] for row in rows] == [10.0, 40.0]
    assert waited["seconds"][OTHER] == straight["seconds"][OTHER] == 0.0
    assert sum(waited["seconds"].values()) == pytest.approx(waited["wall_seconds"])
    # The pauses' ceiling is over the same wall time: the checkpoint's save and load, 4 s of the 50.
    assert ceilings.of_pauses(waited)[PAUSES].share == 4.0 / 50.0


def test_a_later_launch_on_a_clock_behind_the_earlier_ones_waited_no_time():
    times = run_breakdown({0: segments(requeued(-3.0))})
    assert times["seconds"][BETWEEN_SEGMENTS] == 0.0


def test_records_from_before_the_breakdown_are_left_out():
    old_marker = {SEGMENT_MARKER: 1.0, "rank": 0, "run_id": "r"}
    assert segments([interval(0.5, 1, 1, 0.1), old_marker, interval(2.0, 2, 1, 0.1)]) == []
    assert run_breakdown({0: []}) is None


# --- the rank's side --------------------------------------------------------------------------------------------


def monitor_of(run_dir: Path, device: str = "cpu", uuid: str = "") -> Monitor:
    """A rank's monitor whose steps make one interval until it is flushed: none of them is a run's first, which is an
    interval of its own."""
    monitor = Monitor(run_dir, identity(uuid), 1.0, None, torch.device(device), log_every=1000)
    monitor.resumed_at(1)
    return monitor


def step(monitor: Monitor, seconds: float = 0.0) -> None:
    monitor.data_wait_started()
    monitor.data_ready()
    time.sleep(seconds)
    monitor.step(4)


def test_a_cpu_rank_records_its_startup_pauses_and_exit(tmp_path, plain_env):
    monitor = monitor_of(tmp_path)
    with monitor.pause("checkpoint_load"):
        time.sleep(0.2)
    step(monitor, 0.01)
    with monitor.pause("evaluation"):
        time.sleep(0.2)
    step(monitor, 0.01)  # timed from the evaluation's end: the pause is no step
    monitor.flush()
    with monitor.pause("checkpoint_save"):
        time.sleep(0.2)
    monitor.close()
    lines = read_json_lines(RunDir(tmp_path).rank_records(0))
    assert lines[0]["launched_at"] == plain_env
    assert [line["version"] for line in lines] == [record.RECORD_VERSION] * 3  # the marker, the record, the end
    interval = lines[1]
    assert [(p["part"], p["after_steps"]) for p in interval["paused"]] == [
        ("checkpoint_load", 0),
        ("startup", 0),
        ("evaluation", 1),
    ]
    assert interval["step_count"] == 2 and not interval["host_bound_measured"]
    assert max(interval["step_seconds"]) < 0.2 <= min(p["seconds"] for p in interval["paused"])
    assert [p["part"] for p in lines[2]["paused"]] == ["checkpoint_save"] and SEGMENT_ENDED in lines[2]
    (segment,) = segments(lines)
    seconds = segment_seconds(segment, None)
    assert seconds["startup"] >= 2.0 and seconds["evaluation"] >= 0.2
    assert abs(seconds[OTHER]) < 0.02 * segment.wall_seconds  # the parts, measured apart, add up to the wall time


def test_pauses_are_named_and_do_not_nest(tmp_path, plain_env):
    monitor = monitor_of(tmp_path)
    with pytest.raises(ValueError, match="one of evaluation, checkpoint_save, checkpoint_load, compile"):
        monitor.pause_started("coffee")
    monitor.pause_started("evaluation")
    with pytest.raises(ValueError, match="during pause 'evaluation'"):
        monitor.pause_started("checkpoint_save")
    with pytest.raises(ValueError, match="'checkpoint_save' ended, but 'evaluation' had started"):
        monitor.pause_ended("checkpoint_save")
    monitor.close()


def test_a_rank_that_never_steps_spent_its_launch_starting(tmp_path, plain_env):
    monitor_of(tmp_path).close()
    (segment,) = rank_segments(record.read_launches(RunDir(tmp_path).rank_records(0)))
    assert segment_seconds(segment, None)["startup"] == pytest.approx(segment.wall_seconds, abs=1e-9)


class StandInNvml:
    """The pynvml calls GpuBusy makes, answering from (unix time, utilization %) samples as the driver keeps them:
    those after the given time, or NVMLError_NotFound when there are none."""

    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    NVMLError = pynvml.NVMLError

    def __init__(self):
        self.samples: list[pynvml.c_nvmlSample_t] = []

    def add(self, at: float, percent: int) -> None:
        sample = pynvml.c_nvmlSample_t()
        sample.timeStamp, sample.sampleValue.uiVal = int(at * 1e6), percent
        self.samples.append(sample)

    def nvmlDeviceGetSamples(self, handle, sampling_type, since):
        assert sampling_type == self.NVML_GPU_UTILIZATION_SAMPLES
        new = [sample for sample in self.samples if sample.timeStamp > since]
        if not new:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, new

    def nvmlShutdown(self) -> None:
        pass


def test_gpu_busy_reads_the_windows_samples_once_and_leaves_out_the_pauses():
    nvml = StandInNvml()
    busy = GpuBusy(nvml, "handle")
    for at, percent in ((9.0, 10), (10.5, 60), (11.0, 0), (11.5, 80), (12.5, 30)):
        nvml.add(at, percent)
    assert busy.share(10.0, 12.0, not_stepping=[(10.9, 11.1)]) == pytest.approx(0.7)  # 10.5 and 11.5
    assert busy.share(12.0, 12.2, []) is None  # no sample in this window; the one at 12.5 is left for the next
    assert busy.share(12.2, 13.0, []) == pytest.approx(0.3)
    nvml.add(12.9, 100)  # a sample older than the last read never counts twice
    assert busy.share(13.0, 14.0, []) is None


def test_a_gpu_rank_splits_its_steps_by_the_busy_share_nvml_sampled(tmp_path, plain_env, monkeypatch):
    gpu, nvml = FakeGpu(), StandInNvml()
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: gpu.new_event())
    monkeypatch.setattr(GpuBusy, "open", classmethod(lambda cls, uuid: cls(nvml, uuid)))
    monitor = monitor_of(tmp_path, "cuda", "GPU-0")
    time.sleep(0.01)
    nvml.add(time.time(), 40)
    for _ in range(10):  # the loader keeps up: the device idles only for the first batch and the host's launches
        monitor.data_wait_started()
        gpu.host_works(0.003)
        monitor.data_ready()
        gpu.queue(0.06)
        monitor.step(4)
    gpu.drain()
    time.sleep(0.01)
    monitor.flush()
    with monitor.pause("checkpoint_save"):
        nvml.add(time.time(), 0)  # the device idles while the checkpoint is written: no step's business
        time.sleep(0.01)
    nvml.add(time.time() + 0.005, 90)
    time.sleep(0.01)
    monitor.data_wait_started()
    monitor.data_ready()
    gpu.queue(0.06)
    monitor.step(4)
    gpu.drain()
    monitor.flush()
    monitor.close()
    first, second = read_json_lines(RunDir(tmp_path).rank_records(0))[1:3]
    steps, starved = sum(first["step_seconds"]), first["data_wait_seconds"]
    assert first["host_bound_measured"] and starved == pytest.approx(0.003)
    assert first["time_parts"]["host_bound"] == pytest.approx(0.6 * steps - starved)
    assert first["time_parts"]["compute"] == pytest.approx(0.4 * steps)
    assert second["time_parts"]["host_bound"] == pytest.approx(0.1 * sum(second["step_seconds"]))
    assert [p["part"] for p in second["paused"]] == ["checkpoint_save"]
