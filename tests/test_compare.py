"""`trainstack compare`: two run directories side by side. On made-up runs whose answer is known (fast), and on a
real input-bound run against the same run with its loader's delay removed (slow), where compare must name data
starvation as the part that moved, and the input-bound ceiling must agree with the speedup measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import explain, run_trainstack, summary, train
from trainstack import cli
from trainstack.errors import EXIT_CONFIG
from trainstack.monitoring.compare import profile
from trainstack.monitoring.compare.comparison import MOVED, Comparison


def _fake_run(run_dir: Path, model: str = "builtin:tiny-gpt", starved: float = 0.0, workers: int = 1,
              steps: int = 4) -> Path:
    """A 2-rank run directory of `steps`-step records each 0.1 s of compute plus `starved` seconds of starvation."""
    (run_dir / "telemetry").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": model, "num_workers": workers}))
    step = 0.1 + starved
    for rank in range(2):
        lines = [{"segment_started": 100.0, "rank": rank, "launched_at": 90.0}]
        for index in range(1, 4):
            lines.append({"time": 100.0 + index * steps * step, "rank": rank, "step": index * steps,
                          "samples": 8 * steps, "interval_seconds": steps * step, "step_count": steps,
                          "step_seconds": [step] * steps, "data_wait_seconds": starved * steps, "param_bytes": 1000,
                          "time_parts": {"compute": 0.1 * steps, "comm_exposed": 0.0,
                                         "data_starvation": starved * steps, "host_bound": 0.0, "compile": 0.0},
                          "paused": [], "host_bound_measured": False})
        (run_dir / "telemetry" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_compare_marks_the_part_that_moved_and_the_speedup(tmp_path):
    slow = _fake_run(tmp_path / "slow", starved=0.1)
    fixed = _fake_run(tmp_path / "fixed", workers=4)
    comparison = Comparison(profile.load(slow), profile.load(fixed))
    assert comparison.moved_most() == "data_starvation"
    assert [row[""] for row in comparison.parts() if row["part"] == "data_starvation"] == [MOVED]
    assert comparison.speedup == pytest.approx(2.0)  # 0.2 s steps against 0.1 s
    assert {row["setting"]: (row["A"], row["B"]) for row in comparison.settings()} == {"config.num_workers": (1, 4)}
    assert [(row["run"], row["verdict"]) for row in comparison.verdicts()] == [("A", "input-bound"),
                                                                              ("B", "healthy")]


def test_compare_prints_and_writes_its_page(tmp_path, capsys):
    slow, fixed = _fake_run(tmp_path / "slow", starved=0.1), _fake_run(tmp_path / "fixed")
    assert cli.main(["compare", str(slow), str(fixed)]) == 0
    out = capsys.readouterr().out
    assert "data_starvation" in out and MOVED in out
    assert "Where the time went" in (fixed / "compare.html").read_text()


@pytest.mark.parametrize("case", ["not-a-run", "missing", "other-model"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    run = _fake_run(tmp_path / "run")
    other = {"not-a-run": tmp_path, "missing": tmp_path / "nowhere",
             "other-model": _fake_run(tmp_path / "other", model="builtin:small-gpt")}[case]
    assert cli.main(["compare", str(run), str(other)]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert ("different models" if case == "other-model" else "not a trainstack run directory") in error


@pytest.mark.slow
def test_an_input_bound_run_against_its_fixed_run(tmp_path):
    """The same run twice, once with a loader slowed on purpose: compare names starvation as what moved, and the
    slowed run's input-bound ceiling is the speedup the fixed run shows (within 15%: a ceiling is an upper bound,
    and the slowed loader's one worker costs a little CPU besides its sleep)."""
    flags = ("--max-steps", "40", "--checkpoint-every", "0", "--dataset", "tests.factories:slow_dataset")
    runs = {}
    for name, delay in (("slow", "0.02"), ("fixed", "0")):
        runs[name] = tmp_path / name
        result = train(runs[name], *flags, env={"TRAINSTACK_TEST_SAMPLE_DELAY": delay})
        assert result.returncode == 0, explain(result)
    compared = run_trainstack("compare", str(runs["slow"]), str(runs["fixed"]))
    assert compared.returncode == 0, explain(compared)
    moved = [line for line in compared.stdout.splitlines() if MOVED in line]
    assert len(moved) == 1 and moved[0].split()[0] == "data_starvation", compared.stdout
    ceiling = summary(runs["slow"])["ceilings"]["input-bound"]
    measured = Comparison(profile.load(runs["slow"]), profile.load(runs["fixed"])).speedup
    assert measured == pytest.approx(ceiling["speedup"], rel=0.15), (ceiling, measured)
