"""`trainstack compare`: two run directories side by side, on made-up runs whose answer is known: the part that
moved, the speedup, the settings that differ, the verdicts, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainstack.commands import cli
from trainstack.errors import EXIT_CONFIG, ConfigError
from trainstack.monitoring.compare import profile
from trainstack.monitoring.compare.comparison import MOVED, Comparison


def _fake_run(
    run_dir: Path,
    model: str = "builtin:tiny-gpt",
    starved: float = 0.0,
    workers: int = 1,
    steps: int = 4,
    param_bytes: int = 1000,
) -> Path:
    """A 2-rank run directory of `steps`-step records each 0.1 s of compute plus `starved` seconds of starvation."""
    (run_dir / "telemetry").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": model, "num_workers": workers}))
    step = 0.1 + starved
    for rank in range(2):
        lines = [{"segment_started": 100.0, "rank": rank, "launched_at": 90.0}]
        for index in range(1, 4):
            lines.append(
                {
                    "time": 100.0 + index * steps * step,
                    "rank": rank,
                    "step": index * steps,
                    "epoch": 0,
                    "loss": 2.0,
                    "lr": 1e-3,
                    "samples": 8 * steps,
                    "tokens": 0,
                    "interval_seconds": steps * step,
                    "step_count": steps,
                    "step_seconds": [step] * steps,
                    "data_wait_seconds": starved * steps,
                    "param_bytes": param_bytes,
                    "time_parts": {
                        "compute": 0.1 * steps,
                        "comm_exposed": 0.0,
                        "data_starvation": starved * steps,
                        "host_bound": 0.0,
                        "compile": 0.0,
                    },
                    "paused": [],
                    "host_bound_measured": False,
                }
            )
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
    assert [(row["run"], row["verdict"]) for row in comparison.verdicts()] == [("A", "input-bound"), ("B", "healthy")]
    # what the verdict's fix can gain, not its headline again
    assert comparison.verdicts()[0]["ceiling"].startswith("input-bound: the loader starves the device 50%"), comparison
    assert "makes steps up to 2.00x faster" in comparison.verdicts()[0]["ceiling"]


def test_one_model_built_for_another_vocabulary_is_refused_saying_so(tmp_path):
    a, b = _fake_run(tmp_path / "a"), _fake_run(tmp_path / "b", param_bytes=1400)  # the same tiny-gpt, other data
    with pytest.raises(ConfigError, match=r"parameter bytes 1000 vs 1400: one model built for another vocabulary"):
        Comparison(profile.load(a), profile.load(b))


def test_compare_notes_a_run_still_going(tmp_path, capsys):
    from trainstack.commands.cli import main
    from trainstack.rundir import RunDir

    a, b = _fake_run(tmp_path / "a"), _fake_run(tmp_path / "b")
    RunDir(b).lease.mkdir()
    RunDir(b).lease_file(0).write_text(json.dumps({"run_id": "going"}))  # its launcher's heartbeat: fresh
    assert main(["compare", str(a), str(b)]) == 0
    assert (
        capsys.readouterr().err == f"trainstack compare: note: B ({b}) is still going: compared on its steps so far\n"
    )


def test_compare_says_a_run_nothing_was_judged_of_is_not_judged_never_healthy(tmp_path):
    judged = _fake_run(tmp_path / "judged")
    unjudged = _fake_run(tmp_path / "unjudged")
    why = "no rank recorded a step"
    (unjudged / "summary.json").write_text(json.dumps({"version": 1, "judged": False, "not_judged": why}))
    rows = Comparison(profile.load(judged), profile.load(unjudged)).verdicts()
    assert [(row["run"], row["verdict"], row["ceiling"]) for row in rows] == [
        ("A", "healthy", ""),
        ("B", "not judged", why),
    ]


def test_compare_names_the_watched_commands_where_they_differ(tmp_path):
    a, b = _fake_run(tmp_path / "a"), _fake_run(tmp_path / "b")
    for run_dir, mode in ((a, "healthy"), (b, "slowrank")):
        command = f"torchrun --nproc-per-node 2 train.py --mode {mode}"
        (run_dir / "summary.json").write_text(json.dumps({"version": 1, "launcher": "watch", "command": command}))
    differ = {row["setting"]: (row["A"], row["B"]) for row in Comparison(profile.load(a), profile.load(b)).settings()}
    assert differ == {
        "summary.command": tuple(f"torchrun --nproc-per-node 2 train.py --mode {m}" for m in ("healthy", "slowrank"))
    }


def _environment(run_dir: Path, node: int, nccl_algo: str, torch: str, gpus: list[str]) -> None:
    """A node's recorded environment (trainstack/environment.py), as `trainstack train` and `watch` write it."""
    path = run_dir / "environment" / f"node-{node}.json"
    path.parent.mkdir(exist_ok=True)
    described = {
        "variables": {"NCCL_ALGO": nccl_algo, "OMP_NUM_THREADS": "4"},
        "versions": {"python": "3.11.7", "torch": torch, "accelerate": "1.15.0", "cuda": "12.8"},
        "driver": "570.86",
        "gpus": gpus,
    }
    path.write_text(json.dumps(described))


def test_compare_names_what_differs_in_the_recorded_environment(tmp_path):
    a, b = _fake_run(tmp_path / "a"), _fake_run(tmp_path / "b")
    _environment(a, 0, "Ring", "2.13.0", ["H100", "H100"])
    _environment(b, 0, "Tree", "2.14.0", ["H100", "H100"])
    _environment(b, 1, "Tree", "2.14.0", ["A100", "A100"])  # a second node with other GPUs
    differ = {row["setting"]: (row["A"], row["B"]) for row in Comparison(profile.load(a), profile.load(b)).settings()}
    assert differ == {
        "env.NCCL_ALGO": ("Ring", "Tree"),
        "version.torch": ("2.13.0", "2.14.0"),
        "gpus": ("2 x H100", "node 0: 2 x H100; node 1: 2 x A100"),
    }  # the same threads, Python, driver and CUDA: not shown


def test_compare_prints_and_writes_its_page(tmp_path, capsys):
    slow, fixed = _fake_run(tmp_path / "slow", starved=0.1), _fake_run(tmp_path / "fixed")
    assert cli.main(["compare", str(slow), str(fixed)]) == 0
    out = capsys.readouterr().out
    assert "data_starvation" in out and MOVED in out
    assert "Where the time went" in (fixed / "compare.html").read_text()


def test_the_page_never_replaces_a_file_compare_did_not_write(tmp_path, capsys):
    slow, fixed = _fake_run(tmp_path / "slow", starved=0.1), _fake_run(tmp_path / "fixed")
    weights = fixed / "model.safetensors"
    weights.write_bytes(b"weights")
    assert cli.main(["compare", str(slow), str(fixed), "--html", str(weights)]) == EXIT_CONFIG
    assert weights.read_bytes() == b"weights" and "is not a page compare wrote" in capsys.readouterr().err
    for bad in (fixed, tmp_path / "nowhere" / "page.html"):  # a folder; a file in no folder
        assert cli.main(["compare", str(slow), str(fixed), "--html", str(bad)]) == EXIT_CONFIG
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "Traceback" not in error, error
    page = tmp_path / "page.html"
    assert cli.main(["compare", str(slow), str(fixed), "--html", str(page)]) == 0
    assert cli.main(["compare", str(fixed), str(slow), "--html", str(page)]) == 0  # its own page, written anew
    assert "fixed vs slow" in page.read_text()


@pytest.mark.parametrize("case", ["not-a-run", "missing", "other-model", "bad-config"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    run = _fake_run(tmp_path / "run")
    other = {
        "not-a-run": tmp_path,
        "missing": tmp_path / "nowhere",
        "other-model": _fake_run(tmp_path / "other", model="builtin:small-gpt"),
        "bad-config": _fake_run(tmp_path / "bad"),
    }[case]
    if case == "bad-config":
        (other / "config.yaml").write_text("model: [unclosed\n")
    assert cli.main(["compare", str(run), str(other)]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    expected = {"other-model": "different models", "bad-config": "is not a readable config"}
    assert expected.get(case, "not a trainstack run directory") in error
