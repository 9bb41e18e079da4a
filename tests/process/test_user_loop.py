"""A user's own plain DDP loop (examples/ddp_loop.py, instrumented with trainstack.monitor) under
`trainstack watch -- torchrun ...`, on 2 CPU ranks: both ranks reach the exporter, a slowed rank is named the
straggler (and no hang: the launcher collects no hang evidence), and the run ends with the command's exit code and a
report of both ranks."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers.runs import REPO, explain, kill_tree, run_trainstack, start_watch, torchrun, wait_for
from trainstack.rundir import RunDir, free_port

EXAMPLE = REPO / "examples" / "ddp_loop.py"


def steps_by_rank(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {
        line.split('rank="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("trainstack_train_steps_total{")
    }


@pytest.mark.slow
def test_a_plain_ddp_loop_under_watch_has_its_straggler_named(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    watched = start_watch(
        run_dir,
        "--exporter-port",
        str(port),
        "--",
        *torchrun(str(EXAMPLE)),
        "--steps",
        "150",
        "--slow-rank",
        "1",
        "--slow-seconds",
        "0.1",
        # A threshold of 10 s, not the default: a loaded test machine may pause a healthy rank for seconds.
        env={"OMP_NUM_THREADS": "1", "TRAINSTACK_HANG_SECONDS": "10"},
    )
    try:
        wait_for(lambda: len(steps := steps_by_rank(port)) == 2 and min(steps.values()) >= 20, watched)
        diagnosed = run_trainstack("diagnose", "--url", f"http://127.0.0.1:{port}", "--interval", "4", "--json")
        output, _ = watched.communicate(timeout=300)
    finally:
        kill_tree(watched)
    assert diagnosed.returncode == 1, explain(diagnosed)
    verdicts = json.loads(diagnosed.stdout)["verdicts"]
    assert [v["kind"] for v in verdicts] == ["straggler"], verdicts
    assert verdicts[0]["summary"].startswith("rank 1 is a straggler")
    assert watched.returncode == 0, output
    # A straggler is no hang: the launcher collected no evidence of one.
    assert "hang:" not in output and not list(RunDir(run_dir).hang.glob("stall-*"))
    records = RunDir(run_dir).all_rank_records()
    assert sorted(records) == [0, 1]
    for rank, path in records.items():
        steps = [json.loads(line) for line in path.read_text().splitlines() if '"step"' in line]
        assert steps[-1]["step"] == 150 and "comm_exposed_seconds" in steps[-1], rank  # DDP's all-reduce timed
    assert "<figure id='loss'>" in (run_dir / "report.html").read_text()
    # The verdict on the terminal when the run ends: diagnose's words, each rank's time, then the report's place.
    card = output.split("trainstack watch: STRAGGLER  rank 1 is a straggler", 1)[1]
    assert "\n  fix: " in card and "\n  time: rank 0, " in card and "\n  time: rank 1, " in card
    assert card.rstrip().endswith(f"trainstack watch: report: {run_dir}/report.html")
    # watch's summary.json: the command, its exit, and each rank's wall time accounted for by its parts
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert (summary["launcher"], summary["exit_code"], summary["exit_reason"], summary["world_size"]) == (
        "watch",
        0,
        "completed",
        2,
    )
    assert str(EXAMPLE) in summary["command"] and 0 < summary["goodput"] <= 1
    assert [v["kind"] for v in summary["verdicts"]] == ["straggler"]  # judged from the records at the end
    assert summary["judged"] is True and "ranks_not_judged" not in summary
    assert summary["verdicts"][0]["summary"].startswith("rank 1 is a straggler")
    assert summary["verdicts"][0]["ceiling"]["speedup"] > 1
    assert summary["ceilings"]["straggler"] == summary["verdicts"][0]["ceiling"]  # one ceiling per kind
    for rank in summary["time_breakdown"]["ranks"]:
        wall = rank["wall_seconds"]
        assert 0 < wall <= summary["wall_seconds"], rank
        assert abs(rank["seconds"]["other"]) < 0.02 * wall, rank  # the measured parts add up to the wall time
