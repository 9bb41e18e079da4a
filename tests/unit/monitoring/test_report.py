"""The run report: written for a real CPU training run (plus GPU snapshots from the real exporter over the fake
NVML), every figure embedded and decodable, and not blank when headless Chromium renders it."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.helpers.report import embedded_figures
from trainstack.errors import ConfigError
from trainstack.monitoring.report import render_report


def test_a_directory_without_telemetry_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no telemetry records"):
        render_report(tmp_path)


def test_a_run_with_gpu_snapshots_and_no_rank_records_gets_the_gpu_figures(tmp_path):
    """A watched command without trainstack.monitor in its loop: the exporter saw its GPUs, nothing saw ranks."""
    (tmp_path / "telemetry").mkdir()
    with (tmp_path / "telemetry" / "gpu.jsonl").open("w") as snapshots:
        for second in range(3):
            for gpu in range(2):
                snapshots.write(
                    json.dumps(
                        {
                            "time": 1000.0 + second,
                            "gpu": gpu,
                            "uuid": f"GPU-{gpu}",
                            "utilization_ratio": 0.5,
                            "memory_used_bytes": 1 << 30,
                            "memory_total_bytes": 1 << 34,
                            "power_watts": 300.0,
                        }
                    )
                    + "\n"
                )
    report = render_report(tmp_path)
    assert set(embedded_figures(report)) == {"gpu-utilization", "gpu-memory"}
    assert "No rank records" in report.read_text()


def test_a_gpu_run_shows_its_gpu_starvation_with_the_host_wait_beside_it(tmp_path):
    from trainstack.monitoring.report.figures import data_wait
    from trainstack.monitoring.report.runfiles import RunFiles
    from trainstack.monitoring.report.tables import rank_rows
    from trainstack.record import IntervalRecord, Launch

    def record(step: int, clock: str | None) -> IntervalRecord:
        return IntervalRecord(
            time=1000.0 + step,
            rank=0,
            step=step,
            epoch=0,
            loss=None,
            lr=None,
            samples=160,
            tokens=0,
            interval_seconds=0.4,
            data_wait_seconds=0.004,
            step_seconds=(0.04,) * 10,
            host_data_wait_seconds=0.08,
            clock=clock,
        )

    on_gpu = RunFiles(tmp_path, {0: [Launch(None, [record(10, "gpu"), record(20, "gpu")])]}, {}, {})
    row = rank_rows(on_gpu)[0]
    assert row["data-wait ratio"] == pytest.approx(0.01) and row["host-wait ratio"] == pytest.approx(0.2)
    assert row["data wait measured on"] == "GPU timeline"
    assert "on the GPU's timeline" in data_wait(on_gpu).axes[0].get_title()
    # records from before the clock field were all timed on the host: the table is as it was
    older = RunFiles(tmp_path, {0: [Launch(None, [record(10, None), record(20, None)])]}, {}, {})
    assert "host-wait ratio" not in rank_rows(older)[0]
    assert "blocked on the loader" in data_wait(older).axes[0].get_title()


def synthetic_run(run_dir: Path, ranks: int = 2, intervals: int = 4, evaluation_seconds: float = 5.0) -> Path:
    """A watched 2-rank CPU run's records as trainstack.monitor writes them (no DDP: no communication fields;
    CPU: host-bound idle not measured), 10 steps of 1 s an interval, an evaluation after every second one, and the
    summary watch writes. Each rank's wall time is the same ~50 s: side by side, not one after the other."""
    telemetry = run_dir / "telemetry"
    telemetry.mkdir(parents=True)
    for rank in range(ranks):
        lines = [{"segment_started": 1000.0, "rank": rank, "run_id": "r", "launched_at": 1000.0}]
        now = 1000.0
        for number in range(intervals):
            paused = [{"part": "startup", "seconds": 2.0, "after_steps": 0}] if number == 0 else []
            if number % 2 == 1:
                paused.append({"part": "evaluation", "seconds": evaluation_seconds, "after_steps": 10})
            seconds = 10.0 + sum(p["seconds"] for p in paused)
            now += seconds
            lines.append(
                {
                    "time": now,
                    "rank": rank,
                    "step": 10 * (number + 1),
                    "epoch": 0,
                    "loss": 1.0,
                    "lr": 0.1,
                    "samples": 80,
                    "tokens": 0,
                    "interval_seconds": seconds,
                    "data_wait_seconds": 0.5,
                    "host_data_wait_seconds": 0.5,
                    "step_seconds": [1.0] * 10,
                    "clock": "host",
                    "step_count": 10,
                    "time_parts": {"compute": 9.5, "data_starvation": 0.5},
                    "host_bound_measured": False,
                    "paused": paused,
                }
            )
        lines.append({"segment_ended": now + 0.1, "rank": rank, "step_count": 0, "paused": []})
        (telemetry / f"rank-{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "version": 1,
                "run_id": "r",
                "launcher": "watch",
                "command": "torchrun --nproc-per-node 2 train.py",
                "exit_code": 3,
                "exit_reason": "failed",
                "started": 1000.0,
                "wall_seconds": 53.5,
                "world_size": ranks,
            }
        )
    )
    return run_dir


def table_after(page: str, heading: str) -> list[list[str]]:
    table = page.split(heading, 1)[1].split("<table>", 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<t[hd]>(.*?)</t[hd]>", row) for row in table.split("<tr>")[1:]]


def test_the_report_heads_with_the_command_its_exit_and_duration(tmp_path):
    page = render_report(synthetic_run(tmp_path / "run")).read_text()
    header = dict(row for row in table_after(page, "</p>")[1:])
    assert header == {
        "command": "torchrun --nproc-per-node 2 train.py",
        "exit code": "3",
        "ended": "failed",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(1000.0)),  # a date, never 1e+03
        "duration": "53.5 s",
        "world size": "2",
    }
    # The card leads, before the header: the run's verdict as `watch` printed it when the run ended. The command
    # failed: that comes first, and its steps until then, healthy, are not called a healthy run.
    card = "<pre class='card'>FAILED  the command exited with code 3\n  until then: no problem found, 2 rank(s), "
    assert page.index(card) < page.index("<td>command</td>")
    assert "HEALTHY" not in page
    # The summary table says only what the header does not: no field twice, no unix time.
    summary = dict(row for row in table_after(page, "<h2>Summary</h2>")[1:])
    assert not {"command", "exit_code", "exit_reason", "started", "wall_seconds", "world_size"} & set(summary)


def test_a_report_by_hand_of_a_run_still_going_is_of_its_steps_so_far_never_its_last_launchs_end(tmp_path, capsys):
    from trainstack.commands.cli import main
    from trainstack.rundir import RunDir

    run = RunDir(synthetic_run(tmp_path / "run"))  # its summary says how an earlier launch ended: failed
    run.lease.mkdir()
    run.lease_file(0).write_text(json.dumps({"run_id": "going"}))  # a launcher holds it, its heartbeat fresh
    assert main(["report", str(run.path)]) == 0
    page = run.report.read_text()
    going = "<pre class='card'>GOING  a launcher holds the run directory: this report is of the steps recorded so far"
    assert going in page and "FAILED" not in page.split("</pre>")[0] and "HEALTHY" not in page, page[:2000]
    stale = time.time() - 3600  # a killed launcher's lease: the run is not going
    os.utime(run.lease_file(0), (stale, stale))
    assert main(["report", str(run.path)]) == 0
    assert "<pre class='card'>FAILED  the command exited with code 3" in run.report.read_text()
    capsys.readouterr()


def test_a_last_launch_that_ended_before_its_first_interval_is_said_so(tmp_path):
    """A resumed launch whose ranks failed at start (a checkpoint of another model): its records hold a marker and
    an end, no interval, and the report says so rather than failing on an empty table."""
    run_dir = synthetic_run(tmp_path / "run")
    for rank in range(2):
        records = run_dir / "telemetry" / f"rank-{rank}.jsonl"
        failed = [
            {"segment_started": 2000.0, "rank": rank, "run_id": "s"},
            {"segment_ended": 2001.0, "rank": rank, "step_count": 0, "paused": []},
        ]
        records.write_text(records.read_text() + "".join(json.dumps(line) + "\n" for line in failed))
    page = render_report(run_dir).read_text()
    assert "No rank recorded an interval in the run's last launch." in page


def test_where_the_time_went_is_per_rank_wall_time_with_unmeasured_parts_said_so(tmp_path):
    page = render_report(synthetic_run(tmp_path / "run")).read_text()
    rows = {row[0]: row[1:] for row in table_after(page, "<h2>Where the time went</h2>")}
    assert rows["part"] == ["rank 0", "rank 1"]
    assert rows["wall time (s)"] == ["52.1", "52.1"]  # each rank's own, never the two added up
    assert "the run's: 52.1 s, its longest rank's" in page
    assert rows["host_bound"] == rows["comm_exposed"] == ["not measured", "not measured"]  # CPU, no DDP
    assert rows["compute"][0].startswith("38 s (72.9%)") and rows["evaluation"][0].startswith("10 s (")


def test_throughput_is_over_training_time_so_a_pause_is_no_dip(tmp_path):
    from trainstack.monitoring.report.runfiles import load_run, pauses, training_seconds
    from trainstack.monitoring.report.tables import rank_rows

    run = load_run(synthetic_run(tmp_path / "run", evaluation_seconds=10.0))
    rates = {r.samples / training_seconds(r) for r in run.ranks[0]}
    assert rates == {8.0}  # the intervals with an evaluation train as fast as those without
    assert [p for r in run.ranks[0] for p in pauses(r)] == [(0, "startup"), (20, "evaluation"), (40, "evaluation")]
    assert rank_rows(run)[0]["samples/s (training time)"] == pytest.approx(8.0)


def test_an_uninstrumented_run_without_a_gpu_still_gets_a_report_of_its_command(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "version": 1,
                "command": "python train.py",
                "exit_code": 0,
                "exit_reason": "completed",
                "wall_seconds": 12.0,
            }
        )
    )
    page = render_report(run_dir).read_text()
    assert "python train.py" in page and "No rank records" in page and "No GPU snapshots" in page
    # It leads with the card: nothing judged, never healthy (an older summary without `judged`, no records).
    card = page.split("<pre class='card'>", 1)[1].split("</pre>", 1)[0]
    assert card.startswith("NOT JUDGED  no rank recorded a step") and "HEALTHY" not in page


def test_a_train_run_that_recorded_nothing_says_its_ranks_ended_first_and_names_no_watch_flag(tmp_path):
    """trainstack's own loop always records: under `train` the ranks ending first is the one reason."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {"version": 1, "launcher": "train", "steps": 0, "exit_code": 130, "exit_reason": "stopped"}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = render_report(run_dir).read_text()
    assert "No rank records (telemetry/rank-&lt;r&gt;.jsonl): no rank recorded a step: the ranks ended" in page
    assert "--no-auto" not in page and "a few lines in the loop" not in page


def test_a_train_runs_header_starts_at_its_first_segment_and_reads_dates_and_durations(tmp_path):
    from trainstack.monitoring.report.runfiles import RunFiles
    from trainstack.monitoring.report.tables import header_rows, summary_rows

    segments = [
        {"run_id": "a", "started": 1000.0, "ended": 1100.0, "train_seconds": 90.0},
        {"run_id": "b", "started": 1400.0, "ended": 4725.0, "train_seconds": 3000.0},  # resumed 300 s later
    ]
    summary = {"version": 1, "steps": 60, "wall_seconds": 3200.0, "compile_seconds": 65.0, "segments": segments}
    run = RunFiles(tmp_path, {}, {}, summary)
    header = {row[""]: row["value"] for row in header_rows(run)}
    assert header["started"] == time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(1000.0))
    # from the first launch's start to the last's end, not the last launch's wall_seconds alone
    assert header["duration"] == "1h 02m" and header["command"] == "trainstack train"
    assert {row["field"]: row["value"] for row in summary_rows(run)} == {
        "version": 1,
        "steps": 60,
        "compile_seconds": "1m 05s",
    }


def test_the_segment_table_says_how_long_each_segment_waited_after_the_one_before():
    from trainstack.monitoring.report.tables import segment_rows

    stopped = {"run_id": "slurm-7-0", "started": 1000.0, "ended": 1100.0, "samples": 80, "train_seconds": 90.0}
    requeued = {**stopped, "run_id": "slurm-7-1", "started": 1130.0, "ended": 1200.0}
    rows = segment_rows([stopped, requeued])
    assert [row["waited before (s)"] for row in rows] == [None, 30.0]  # in the queue after the requeue
