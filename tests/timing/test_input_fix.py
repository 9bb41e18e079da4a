"""An input-bound run and its fixed run, on real 2-rank CPU runs: the input-bound ceiling of the starved run (its
summary.json) predicts the speedup measured once the injected delay is removed, and compare names data starvation
as the part that moved.

Why the two agree here, and where they would not: the ceiling is the speedup of a loader that never starves the
ranks, 1 / (1 - starvation share), with the rest of the step unchanged. Removing the delay is that fix only if the
delay is all the starvation there is and removing it changes nothing else:
- no loader workers: each rank fetches its own batch, so both ranks starve at once in every step. With workers, a
  rank's fetch falls in another step than its peer's, and the time one rank starves its peer waits at the all-reduce,
  which the starvation share does not count; and the workers' CPU would compete with the ranks on 2 cores;
- the delay spins in the rank (tests.factories.BusyRandomBytes): a rank that slept instead gave its core away while
  it waited, and on a loaded host came back to caches and a run queue the other processes had taken, so its compute
  was 1.3x-1.7x slower than the fixed run's and the measured speedup passed the ceiling (3.0x against 1.9x);
- full-length samples (64 bytes): the compute is long beside the batch's collation, the starvation that stays once
  the delay is gone (about 1% of a step).
- starvation about half of the starved step: the ceiling 1 / (1 - share) grows steeply with the share, so at 80% a
  2-point error in it moves the ceiling 11%. A fixed delay made that share whatever the host's speed left (80% on a
  host whose steps took a quarter of those it was chosen on, where the measured speedup passed the ceiling by 38%),
  so the delay is set from the first fixed run: as long a wait per batch as that run's whole step.
What is left is the host: the two runs' compute is measured a minute apart on a shared machine, so the runs come in
alternated pairs (fixed, starved, then starved, fixed) and the speedup is their geometric mean, as in bench/. Each run
judges about 100 steps: a step takes some 25 ms here, and a 25-step window let one burst of host work move a run's
compute by 18% (CI's measured speedups passed the ceilings by that in both pairs), while the runs' start-up, not
their steps, is most of what this test costs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import explain, summary, train
from trainstack.commands import cli
from trainstack.monitoring.compare import profile
from trainstack.monitoring.compare.comparison import MOVED, Comparison
from trainstack.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timing]

CEILING_TOLERANCE = 0.2
"""The spin itself slows the starved run's compute a little (8-9% beside the fixed run's over four pairs here; why is
not known: one process alone computes as fast after a spin), which the ceiling, taking the rest as unchanged, does
not see: the measured speedup passes the ceiling by that much, and by up to 18% on a loaded host."""
RUN = (
    "--dataset",
    "tests.factories:busy_random_bytes",
    "--num-workers",
    "0",
    "--max-steps",
    "120",
    "--log-every",
    "12",
    "--checkpoint-every",
    "0",
    "--eval-fraction",
    "0",
    "--seq-len",
    "64",
)


def _run(run_dir: Path, sample_delay: float) -> Path:
    result = train(run_dir, *RUN, env={"TRAINSTACK_TEST_SAMPLE_DELAY": str(sample_delay)})
    assert result.returncode == 0, explain(result)
    return run_dir


def _batch_size(run_dir: Path) -> int:
    return yaml.safe_load(RunDir(run_dir).config.read_text())["batch_size"]


def _step_seconds(run_dir: Path) -> float:
    done = summary(run_dir)
    return done["world_size"] * _batch_size(run_dir) / done["samples_per_second"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> list[tuple[Path, Path]]:
    """(starved run, fixed run) per pair, the second pair in the other order so a drifting host load cancels; each
    starved batch waits as long as the first fixed run's step took."""
    folder = tmp_path_factory.mktemp("input-fix")
    first_fixed = _run(folder / "fixed-0", 0)
    sample_delay = _step_seconds(first_fixed) / _batch_size(first_fixed)
    first_starved = _run(folder / "starved-0", sample_delay)
    second_starved = _run(folder / "starved-1", sample_delay)
    return [(first_starved, first_fixed), (second_starved, _run(folder / "fixed-1", 0))]


def test_the_input_bound_ceiling_predicts_the_speedup_of_removing_the_delay(pairs):
    ceilings = [summary(starved)["ceilings"]["input-bound"]["speedup"] for starved, _ in pairs]
    speedups = [Comparison(profile.load(starved), profile.load(fixed)).speedup for starved, fixed in pairs]
    ceiling, speedup = statistics.geometric_mean(ceilings), statistics.geometric_mean(speedups)
    shown = f"ceilings {ceilings}, measured speedups {speedups}"
    assert ceiling > 1.3, shown  # a starvation worth a fix: the agreement below then says something
    assert ceiling == pytest.approx(speedup, rel=CEILING_TOLERANCE), shown


def test_compare_names_data_starvation_as_the_part_that_moved(pairs, capsys):
    starved, fixed = pairs[0]
    assert Comparison(profile.load(starved), profile.load(fixed)).moved_most() == "data_starvation"
    assert cli.main(["compare", str(starved), str(fixed)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if MOVED in line]
    assert line.split()[0] == "data_starvation", line
