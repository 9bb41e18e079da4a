"""`trainstack tune` on real 2-rank CPU runs: a loader slowed on purpose, where tune must pick more loader workers
with every round's ratio above 1 and its mean above 1.2, leave the source untouched and its scratch folder
removed, and write the baseline against the winner as compare's page; a delayed all-reduce, where a comm-bound fix
must win; a healthy run, where none may (the candidates and the rule: tests/unit/trainstack/test_tune.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import explain, judged_while_unhealthy, run_trainstack
from trainstack.telemetry.comm import TEST_ALLREDUCE_DELAY_ENV


@pytest.mark.slow
@pytest.mark.timing
def test_tune_picks_more_workers_for_a_starved_loader(tmp_path):
    source = tmp_path / "base.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "batch_size": 8,
                "num_workers": 2,
                "persistent_workers": True,  # one trial less a round: within an epoch it changes nothing
                "dataset": "tests.factories:slow_dataset",
                "output_dir": str(tmp_path / "never-written"),
            }
        )
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    write = tmp_path / "tuned.yaml"
    result = run_trainstack(
        "tune",
        str(source),
        "--write",
        str(write),
        "--steps",
        "10",
        "--max-rounds",
        "2",  # and at least 2 (the default): the spread of two rounds' ratios is the noise
        "--scratch",
        str(scratch),
        env={"TRAINSTACK_TEST_SAMPLE_DELAY": "0.04"},
        timeout=400,
    )
    assert result.returncode == 0, explain(result)
    measured = [line for line in result.stdout.splitlines() if "x the baseline (" in line]
    # each round: the baseline, then each candidate
    assert result.stderr.count("tune: trial") == 2 * (1 + len(measured)), result.stderr
    assert any(line.startswith("prefetch_factor=4") for line in measured)  # the loader's other fix, tried too
    line = next(line for line in result.stdout.splitlines() if line.startswith("num_workers=4"))
    ratio = float(line.split("x the baseline")[0].split()[-1])
    low = float(line.split("spread ")[1].split("-")[0])
    assert ratio > 1.2 and low > 1, result.stdout
    assert yaml.safe_load(write.read_text())["num_workers"] == 4
    assert "output_dir" not in yaml.safe_load(write.read_text())
    assert list(scratch.iterdir()) == [] and not (tmp_path / "never-written").exists()
    page = write.with_suffix(".html").read_text()  # the result as compare's page, beside the config
    assert "baseline trial" in page and "num_workers=4 trial" in page and "data_starvation" in page
    assert str(scratch) not in page  # names the trials, not their removed folders
    assert f"page: {write.with_suffix('.html')}" in result.stdout


def _tune_two_ranks(tmp_path, options: dict, env: dict, rounds: int, steps: int = 10):
    """`trainstack tune` on a 2-rank config of `options` with `steps`-step trials: (its result, the path of the
    winner)."""
    source = tmp_path / "base.yaml"
    source.write_text(yaml.safe_dump({"batch_size": 8, **options}))
    write = tmp_path / "tuned.yaml"
    rounds_flags = ["--min-rounds", str(rounds), "--max-rounds", str(rounds)]
    result = run_trainstack("tune", str(source), "--write", str(write), "--steps", str(steps), *rounds_flags, env=env)
    assert result.returncode == 0, explain(result)
    return result, write


COMM_BOUND_FIXES = ("grad_accum=", "ddp_bucket_cap_mb=")
"""The candidates that cut what the all-reduces cost a step: fewer per sample (gradient accumulation under no_sync),
or fewer, larger buckets."""


@pytest.mark.slow
@pytest.mark.timing
def test_tune_picks_a_comm_bound_fix_for_a_delayed_allreduce(tmp_path):
    # Each all-reduce held back 0.3 s after it finishes, as a slow link would, sleeping: most of a step, whatever
    # the load of the host does to the compute. Halving the all-reduces per sample gains 1.5x-1.8x, so one round
    # stands clear of the noise. Accumulating over 2 micro-batches already leaves out DDP's static graph, which
    # cannot start under no_sync: one trial less.
    options = {"num_workers": 1, "grad_accum": 2}
    result, write = _tune_two_ranks(tmp_path, options, {TEST_ALLREDUCE_DELAY_ENV: "0.3"}, rounds=1)
    assert "comm-bound" in result.stdout.splitlines()[0], result.stdout
    winner = result.stdout.split("winner: ")[-1].split(",")[0]
    assert winner.startswith(COMM_BOUND_FIXES), result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith(winner))
    ratio, low = float(line.split("x the baseline")[0].split()[-1]), float(line.split("spread ")[1].split("-")[0])
    assert ratio > 1.2 and low > 1, result.stdout
    assert yaml.safe_load(write.read_text())  # the winner, as a config train takes


@pytest.mark.slow
@pytest.mark.timing
def test_tune_keeps_the_baseline_of_a_healthy_run(tmp_path):
    # Four workers per rank keep up with the built-in data, and tune tries no more on 2 cores (two per core at
    # most). Two did not always: on a slow host they left 9% of the step starved, and num_workers=4 won 1.05-1.14
    # in each of three rounds, a real gain. Three rounds: a candidate wins only where every round beats the noise.
    # 20-step trials (tune's default): the baseline is judged from its steps after the first interval, and on CI's
    # host 9 of them once read a straggler (the host's noise that run 1.33).
    # Tuned again, in a folder of its own, where the baseline got a verdict or a candidate won: one CI run's baseline
    # read a straggler (and kept the baseline); another's prefetch_factor=4 beat a healthy baseline by 1.07-1.14 in
    # each of three rounds against a noise of 1.06, its compute 15% faster, its wait for data 2 ms less. Trials
    # that differ by the host alone by 4-10% crown a candidate in 0.4-1.3% of three-round tunes by tune's rule
    # (bench/tune_false_wins.py); a winner the code crowns on a healthy run, every run crowns.
    attempts: list[Path] = []

    def tuned() -> tuple[subprocess.CompletedProcess, Path]:
        attempts.append(tmp_path / f"attempt-{len(attempts)}")
        attempts[-1].mkdir()
        return _tune_two_ranks(attempts[-1], {"num_workers": 4}, {}, rounds=3, steps=20)

    judged = judged_while_unhealthy(
        tuned,
        lambda tune: (
            tune[0].stdout.splitlines()[:1] == ["baseline verdicts: healthy"]
            and "winner: the baseline" in tune[0].stdout
        ),
    )
    result, write = judged[-1]
    assert result.stdout.splitlines()[0] == "baseline verdicts: healthy", [tune.stdout for tune, _ in judged]
    assert "winner: the baseline" in result.stdout and not write.exists(), [tune.stdout for tune, _ in judged]
