"""A Snapshot from a finished run's telemetry records (monitoring/diagnose/finished.py): the last launch only, its
intervals after the first (warm-up), the verdicts diagnose gives on it, and the one ceiling per kind that both
they and summary.json carry."""

import json
from collections.abc import Iterator

import pytest

from tests.helpers.scrapes import served_metrics
from trainstack import breakdown, catalog, ceilings
from trainstack.monitoring.diagnose.finished import (
    JUDGED_STEPS_MIN,
    NO_INTERVAL,
    NOTHING_RECORDED,
    end_card,
    judged,
    judged_of,
    judgement,
    snapshot_from_records,
    snapshot_of_steps,
)
from trainstack.monitoring.diagnose.render import NOTHING_RECORDED_BY_TRAIN, card, duration, time_lines, verdict_lines
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.monitoring.report import render_report
from trainstack.record import SEGMENT_ENDED, SEGMENT_MARKER
from trainstack.rundir import LAUNCHER_TRAIN, RunDir
from trainstack.thresholds import Thresholds


def record(rank: int, step: int, exposed: float, forward: float, data_wait: float = 0.01, steps: int = 10) -> dict:
    """An interval of 10 steps of 0.1 s on a CPU rank; of `steps` steps, each the same, if given."""
    if steps != 10:
        scaled = record(rank, step, exposed * steps / 10, forward * steps / 10, data_wait * steps / 10)
        parts = {part: seconds * steps / 10 for part, seconds in scaled["time_parts"].items()}
        stepped = {"interval_seconds": 0.1 * steps, "step_seconds": [0.1] * steps, "step_count": steps}
        return scaled | stepped | {"samples": 8 * steps, "time_parts": parts}
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


def test_a_phase_of_steps_is_judged_from_its_own_intervals_after_its_first(tmp_path):
    """A run that slows rank 1 in steps 31-60 only, in one launch: the phase's window names it; the healthy steps
    around it name nobody, and the phase's first interval (20-30 here: healthy on rank 1, a straggler on rank 0 in
    its numbers) is left out."""
    run = RunDir(tmp_path)
    healthy = {rank: [record(rank, s, 0.02, 0.1) for s in (10, 20, 70, 80, 90)] for rank in (0, 1)}
    slowed = {
        0: [record(0, 30, 0.0, 0.3)] + [record(0, s, 0.3, 0.1) for s in (40, 50, 60)],
        1: [record(1, 30, 0.3, 0.1)] + [record(1, s, 0.02, 0.38) for s in (40, 50, 60)],
    }
    write_run(run, {rank: [sorted(healthy[rank] + slowed[rank], key=lambda r: r["step"])] for rank in (0, 1)})
    phase = snapshot_of_steps(run, 20, 60)
    assert "steps 21-60" in phase.source and phase.now == 1060.0
    assert [r.steps for r in phase.ranks] == [60.0, 60.0]
    assert [r.comm_exposed_ratio for r in phase.ranks] == [pytest.approx(0.3), pytest.approx(0.02)]
    verdicts = diagnose(phase, Thresholds())
    assert [v.kind for v in verdicts] == ["straggler"] and verdicts[0].summary.startswith("rank 1 is a straggler")
    assert diagnose(snapshot_of_steps(run, 60, 90), Thresholds()) == []
    # An interval that straddles the phase's edge is no part of it: steps 25-35 would mix both
    assert [r.comm_exposed_ratio for r in snapshot_of_steps(run, 25, 60).ranks] == [
        pytest.approx(0.3),
        pytest.approx(0.02),
    ]
    # A window with one interval or none leaves nothing after its first to judge
    assert snapshot_of_steps(run, 90, 120).ranks == []


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


def test_a_finished_runs_pauses_are_shares_of_its_steady_windows_time(tmp_path):
    run = RunDir(tmp_path)
    saving = [
        {"part": "checkpoint_save", "seconds": 0.25, "after_steps": 5},
        {"part": "startup", "seconds": 9.0, "after_steps": 0},
    ]
    write_run(
        run,
        {
            0: [[record(0, s, 0.02, 0.1) | {"paused": saving} for s in (10, 20, 30)]],
            1: [[record(1, s, 0.3, 0.1) for s in (10, 20, 30)]],
        },
    )
    rank_0, rank_1 = snapshot_from_records(run).ranks
    assert rank_0.paused_ratio == {"checkpoint_save": 0.25}  # the startup is no pause; the first interval not judged
    assert rank_1.paused_ratio == {}


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


def test_a_run_of_too_few_steps_after_its_warm_up_is_not_judged_and_one_more_is(tmp_path):
    """A smoke test's steps after the first say nothing of the run (a 2-step CPU run's second step once named a
    straggler at 28%): below JUDGED_STEPS_MIN no verdict is given, and the headline says why."""
    enough = JUDGED_STEPS_MIN

    def write(after_warm_up: int) -> None:
        shape = {0: (0.3, 0.1), 1: (0.02, 0.38)}  # rank 1 the straggler, by 28% of each step
        records = {
            rank: [
                record(rank, 1, *shape[rank], steps=1),
                record(rank, 1 + after_warm_up, *shape[rank], steps=after_warm_up),
            ]
            for rank in (0, 1)
        }
        write_run(RunDir(tmp_path / str(after_warm_up)), {rank: [records[rank]] for rank in (0, 1)})

    write(enough - 1)
    found = judgement(tmp_path / str(enough - 1))
    assert found.verdicts is None and found.not_judged.startswith(
        f"too few steps to judge: {enough - 1} in the last launch"
    )
    assert end_card(tmp_path / str(enough - 1), found.summary_keys())[0].startswith("NOT JUDGED  too few steps")
    write(enough)
    assert [v["kind"] for v in judgement(tmp_path / str(enough)).verdicts] == ["straggler"]


def test_a_run_no_rank_recorded_is_not_judged(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"version": 1, "command": "python train.py"}))
    assert judged(tmp_path) is None  # nothing judged, which an empty list (healthy) would hide


def test_nothing_judged_is_said_in_summary_json_never_left_out(tmp_path):
    run = RunDir(tmp_path)
    run.telemetry.mkdir(parents=True)
    found = judgement(run)
    assert found.verdicts is None and found.not_judged == NOTHING_RECORDED
    assert found.summary_keys() == {"judged": False, "not_judged": NOTHING_RECORDED}
    # Under `train`, whose loop always records, only the ranks ending first leaves nothing: no watch flag is named.
    assert judgement(run, LAUNCHER_TRAIN).not_judged == NOTHING_RECORDED_BY_TRAIN
    assert "--no-auto" in NOTHING_RECORDED and "--no-auto" not in NOTHING_RECORDED_BY_TRAIN
    # Summaries written before `judged`: `verdicts` was there where the run was judged.
    assert judged_of({"verdicts": []}) is True and judged_of({"judged": False}) is False and judged_of({}) is None


def test_a_partly_instrumented_run_names_the_ranks_not_judged_and_judges_the_others(tmp_path):
    run = RunDir(tmp_path)
    write_run(run, {0: [[record(0, s, 0.05, 0.1) for s in (10, 20, 30)]], 2: [[]]})  # rank 2: a marker alone
    found = judgement(run)
    assert found.verdicts is not None  # rank 0 was judged
    assert found.unjudged == {"1": "no records file", "2": NO_INTERVAL}
    assert found.summary_keys()["ranks_not_judged"] == found.unjudged
    # A file this trainstack cannot read is that rank's alone: the others are still judged.
    run.rank_records(2).write_text(json.dumps({"version": 99, "time": 1.0}) + "\n")
    unreadable = judgement(run).unjudged["2"]
    assert unreadable.startswith("its records cannot be read: ") and "upgrade trainstack" in unreadable
    card_lines = end_card(run, judgement(run).summary_keys())
    assert card_lines[0].startswith("HEALTHY  1 rank(s)") and card_lines[1].startswith("  not judged: rank 1 (no ")
    # No rank judged at all: the headline says why, naming each rank.
    run.rank_records(0).unlink()
    alone = judgement(run)
    assert alone.verdicts is None and alone.not_judged.startswith("no rank could be judged: rank 0 (no records file)")


def test_the_end_of_run_card_of_an_input_bound_run_is_diagnoses_words_and_each_ranks_time(tmp_path):
    run = RunDir(tmp_path)
    write_run(run, {rank: [[record(rank, s, 0.02, 0.1, data_wait=0.45) for s in (10, 20, 30)]] for rank in (0, 1)})
    found = judgement(run)
    summary = {"time_breakdown": breakdown.of_run(tmp_path), **found.summary_keys()}
    lines = end_card(run, summary)
    assert len(lines) <= 12
    first = found.verdicts[0]
    assert lines[0] == f"INPUT-BOUND  {first['summary']}"  # diagnose's own line (render.verdict_lines)
    assert verdict_lines([first])[0] == lines[0]
    assert any(line.strip() == f"fix: {first['fix']}" for line in lines)
    assert any(line.strip() == f"ceiling: {first['ceiling']['text']}" for line in lines)
    times = [line for line in lines if line.startswith("  time: ")]
    assert [t.split(",")[0] for t in times] == ["  time: rank 0", "  time: rank 1"]
    assert lines[1:4] == [f"  evidence: {item}" for item in first["evidence"]] + [f"  fix: {first['fix']}"]
    # Each rank's time by part, the loop's pauses folded into one (the report splits them), compiling apart; parts
    # of no time left out.
    seconds = dict.fromkeys(breakdown.PARTS, 0.0) | {"compute": 25.0, "data_starvation": 60.0, "evaluation": 5.0}
    seconds |= {"checkpoint_save": 5.0, "compile": 5.0}
    row = {"rank": 3, "wall_seconds": 100.0, "seconds": seconds}
    shares = "compute 25%, data starvation 60%, pauses 10%, compile 5%"
    assert time_lines({"ranks": [row]}) == [f"  time: rank 3, 1m 40s: {shares}"]
    # a run that hung, failed or was stopped: its ranks' times end at their last records, not at the run's end
    assert time_lines({"ranks": [row]}, ended_early=True) == [f"  time: rank 3, 1m 40s to its last record: {shares}"]
    assert time_lines({"ranks": [row] * 10})[-1] == "  time: 2 more rank(s) in the report"


def test_a_healthy_card_is_one_line_with_its_throughput_and_nothing_judged_one_line_saying_why(tmp_path):
    run = RunDir(tmp_path)
    write_run(run, {rank: [[record(rank, s, 0.02, 0.1) for s in (10, 20, 30)]] for rank in (0, 1)})
    summary = {"time_breakdown": breakdown.of_run(tmp_path), **judgement(run).summary_keys()}
    (line,) = end_card(run, summary)
    assert line == "HEALTHY  2 rank(s), 10.00 steps/s per rank, 160.0 samples/s in all"
    assert end_card(run, {}) == [line]  # no summary (an older trainstack's run): judged from the records
    (nothing,) = end_card(run, {"judged": False, "not_judged": "why"})
    assert nothing == "NOT JUDGED  why"
    assert card(None, None, None) == [f"NOT JUDGED  {NOTHING_RECORDED}"]


def test_a_run_that_did_not_complete_says_how_it_ended_first_and_is_never_called_healthy(tmp_path):
    run = RunDir(tmp_path)
    write_run(run, {rank: [[record(rank, s, 0.02, 0.1) for s in (10, 20, 30)]] for rank in (0, 1)})
    judged_keys = {"time_breakdown": breakdown.of_run(tmp_path), **judgement(run).summary_keys()}
    until = "  until then: no problem found, 2 rank(s), 10.00 steps/s per rank, 160.0 samples/s in all"
    watched = {**judged_keys, "command": "torchrun train.py", "exit_reason": "failed", "exit_code": 1}
    assert end_card(run, watched) == ["FAILED  the command exited with code 1", until]
    # rank 1 raised and closed its records; torchrun then killed rank 0, whose records have no closing line
    times = json.loads(json.dumps(judged_keys["time_breakdown"]))
    times["ranks"][0]["segments"][-1]["ended"] = "killed"
    assert end_card(run, {**watched, "time_breakdown": times})[0] == (
        "FAILED  the command exited with code 1 (rank 1 ended on its own, rank 0 was killed, as a launcher ends "
        "the others once one fails)"
    )
    failed = {**judged_keys, "exit_reason": "failed", "exit_code": 70, "error": "rank 1: out of memory\nmore"}
    assert end_card(run, failed)[0] == "FAILED  rank 1: out of memory"  # train's error, its first line
    stopped = {**judged_keys, "command": "python train.py", "exit_reason": "preempted", "exit_code": 130}
    assert end_card(run, stopped) == [
        "STOPPED  the command was stopped by a signal before its last step (exit code 130)",
        until,
    ]
    hang = {"headline": "rank 1 has not joined broadcast #243", "evidence": [], "fix": "make every rank call it"}
    hung = {**watched, "hang": {**hang, "culprits": [1], "evidence_dir": "run/hang/stall-1"}}
    assert end_card(run, hung) == [
        "HUNG  rank 1 has not joined broadcast #243",
        "  fix: make every rank call it",
        "  evidence: run/hang/stall-1",
        until,
    ]
    # Its steps' verdicts still follow, each under its own headline.
    run_slow = RunDir(tmp_path / "slow")
    write_run(run_slow, {r: [[record(r, s, 0.02, 0.1, data_wait=0.45) for s in (10, 20, 30)]] for r in (0, 1)})
    slow = {**judgement(run_slow).summary_keys(), **{k: hung[k] for k in ("exit_reason", "exit_code", "hang")}}
    lines = end_card(run_slow, slow)
    assert lines[0].startswith("HUNG  ") and lines[3].startswith("INPUT-BOUND  ")
    assert end_card(run, {**judged_keys, "exit_reason": "completed", "exit_code": 0})[0].startswith("HEALTHY  ")


ANOTHER_RUN = (
    f"# TYPE {catalog.WATCH_COMMAND_PROCESSES.name} gauge\n{catalog.WATCH_COMMAND_PROCESSES.name} 2.0\n"
    f"# TYPE {catalog.WATCH_COMMAND_INFO.name} gauge\n"
    f'{catalog.WATCH_COMMAND_INFO.name}{{command="python other.py",run_id="other"}} 1.0\n'
)
"""The exporter of another run, still going, on the port --url names."""


@pytest.fixture
def another_run() -> Iterator[str]:
    with served_metrics(ANOTHER_RUN) as url:
        yield url


def test_diagnose_of_a_run_that_has_ended_gives_the_verdict_its_launcher_kept(tmp_path, capsys, another_run):
    from trainstack.commands.cli import main
    from trainstack.rundir import free_port
    from trainstack.supervisor.supervised import findings

    run = RunDir(tmp_path)
    write_run(run, {rank: [[record(rank, s, 0.02, 0.1, data_wait=0.45) for s in (10, 20, 30)]] for rank in (0, 1)})
    kept = {"exit_reason": "completed", "exit_code": 0, **findings(tmp_path, breakdown.of_run(tmp_path), "watch")}
    run.summary.write_text(json.dumps(kept))
    # whatever answers at --url now (here another run's exporter, on the default port by default) is not this run
    for url in (another_run, f"http://127.0.0.1:{free_port()}/metrics"):
        assert main(["diagnose", "--run-dir", str(tmp_path), "--url", url]) == 1  # a problem found
        shown = capsys.readouterr().out.splitlines()
        assert shown[0] == f"trainstack diagnose: {run.summary} (the run has ended)"
        assert shown[1:] == end_card(run, kept)
    assert main(["diagnose", "--run-dir", str(tmp_path), "--url", another_run, "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["verdicts"] == json.loads(run.summary.read_text())["verdicts"]
    assert shown["figures"]["ranks"] == 2 and shown["figures"]["steps_per_second"] > 0  # the card's throughput


def test_diagnose_of_a_run_directory_is_that_runs_or_one_line_saying_why_not(tmp_path, capsys, another_run):
    from trainstack.commands.cli import main
    from trainstack.rundir import free_port

    for nothing in (tmp_path / "absent", tmp_path):
        assert main(["diagnose", "--run-dir", str(nothing), "--url", another_run]) == 2
        said = capsys.readouterr().err
        assert said == (
            f"trainstack diagnose: error: --run-dir {nothing} is not a run directory (no summary.json, lease, "
            "records, metrics or hang evidence): pass the --output-dir of trainstack train or the --run-dir of trainstack watch\n"
        )
    run = RunDir(tmp_path)
    run.lease.mkdir()
    run.lease_file(0).write_text(json.dumps({"run_id": "mine"}))  # its launcher holds it: the run is going
    # Said from the first scrape, before the interval between two is waited out (an hour here)
    assert main(["diagnose", "--run-dir", str(tmp_path), "--url", another_run, "--interval", "3600"]) == 2
    assert (
        f"{another_run} serves run other, not {tmp_path}'s (mine): pass --url with the port" in capsys.readouterr().err
    )
    gone = f"http://127.0.0.1:{free_port()}/metrics"  # going with --exporter-port 0, or killed with its lease left
    assert main(["diagnose", "--run-dir", str(tmp_path), "--url", gone]) == 69
    said = capsys.readouterr().err
    assert f"{tmp_path} holds no finished run (no summary.json): it is going with its exporter elsewhere" in said
    assert said.count("\n") == 1


def test_durations_read_as_hours_minutes_seconds():
    assert [duration(s) for s in (4.25, 65, 3600 + 125)] == ["4.2 s", "1m 05s", "1h 02m"]


def test_the_card_on_stderr_names_the_program_and_the_fix_in_the_launchers_words(tmp_path, capsys):
    from trainstack.rundir import LAUNCHER_TRAIN
    from trainstack.supervisor.supervised import findings, print_card

    run = RunDir(tmp_path)
    write_run(run, {rank: [[record(rank, s, 0.02, 0.1, data_wait=0.45) for s in (10, 20, 30)]] for rank in (0, 1)})
    times = breakdown.of_run(tmp_path)
    summary = {"steps": 30, **findings(tmp_path, times, LAUNCHER_TRAIN)}
    assert summary["judged"] is True and "--num-workers" in summary["verdicts"][0]["fix"]  # train's flags
    run.summary.write_text(json.dumps({"version": 1, **summary}))
    print_card(tmp_path, "trainstack train", tmp_path / "report.html")
    shown = capsys.readouterr().err.splitlines()
    assert shown[0].startswith("trainstack train: INPUT-BOUND  ") and "\033[" not in shown[0]  # no colour off a TTY
    assert all(line.startswith("  ") for line in shown[1:-1]) and len(shown) <= 12
    assert shown[-1] == f"trainstack train: report: {tmp_path / 'report.html'}"
    watched = findings(tmp_path, times, "watch")["verdicts"][0]["fix"]
    assert "--num-workers" not in watched and "DataLoader(num_workers=...)" in watched  # the script's own knobs


def test_a_summary_the_card_cannot_read_costs_one_line_never_the_run(tmp_path, capsys):
    from trainstack.supervisor.supervised import print_card

    RunDir(tmp_path).telemetry.mkdir(parents=True)
    print_card(tmp_path, "trainstack watch", None, {"judged": True, "verdicts": [{"kind": "input-bound"}]})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trainstack watch: no verdict: KeyError")
