"""`trainstack tune CONFIG_OR_RUN_DIR`: short trials that try the fixes the baseline's diagnosis names, alternated
with the baseline, and the winning options written as a config file for `trainstack train --config`. Trials run in
a scratch folder removed afterwards: a run directory given as the source is only read (its config file).

With a winner, its trial against the baseline's is also written as `trainstack compare`'s HTML page (--html).

Exit status: 0 done (a winner written, or the baseline kept); 2 bad input; 1 a trial failed; 130 Ctrl-C (what was
measured so far is printed, and a winner found by then is written)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from trainstack.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from trainstack.rundir import CONFIG_FILE

EXIT_INTERRUPTED = 130
NOT_WRITTEN = ("output_dir", "resume")
"""A tuned config names no run directory and no checkpoint: the run it starts is the user's to place."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        type=Path,
        metavar="CONFIG_OR_RUN_DIR",
        help=f"a config file (.yaml/.toml) or a run directory (its {CONFIG_FILE} is read, nothing else)",
    )
    parser.add_argument(
        "--write",
        type=Path,
        default=Path("tuned.yaml"),
        help="the winning options as a config file (default tuned.yaml; never overwritten)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        help="the baseline against the winner, as trainstack compare's page (default: --write's path with .html; "
        "never overwritten)",
    )
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per trial (default 20)")
    parser.add_argument(
        "--min-rounds",
        type=int,
        help="rounds (the baseline, then each candidate) before a candidate can be decided (default 2, or "
        "--max-rounds where that is fewer)",
    )
    parser.add_argument("--max-rounds", type=int, default=3, help="rounds at most (default 3)")
    parser.add_argument(
        "--budget", type=float, default=900.0, help="seconds after which no new round starts (default 900)"
    )
    parser.add_argument("--scratch", type=Path, help="where the trial folders go (default: the temporary folder)")


def _write(path: Path, base: dict, options: dict) -> None:
    values = {key: value for key, value in {**base, **options}.items() if key not in NOT_WRITTEN}
    with path.open("x") as file:  # "x": never over a file that appeared since the start
        yaml.safe_dump(values, file, sort_keys=False)


class TrialBar:
    """tune's progress on stderr (trials.Progress): on a terminal, tqdm's bar over the trials, naming the running one
    and its seconds so far; each trial's line as it ends, on a terminal or not."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=1, unit="trial", file=sys.stderr, disable=None, dynamic_ncols=True, leave=False)
        self._since = time.monotonic()
        self._name = ""

    def started(self, number: int, name: str, planned: int) -> None:
        self._bar.total = planned
        self._bar.n = number - 1
        self._since = time.monotonic()
        self._name = name
        self.running()

    def running(self) -> None:
        self._bar.set_description_str(f"trial {self._bar.n + 1} {self._name} {time.monotonic() - self._since:.0f} s")

    def ended(self, line: str) -> None:
        self._bar.update(1)
        self._bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


def run(args: argparse.Namespace) -> int:
    from trainstack.commands.tune.config import TuneConfig
    from trainstack.commands.tune.trials import TrialFailed, Tuner
    from trainstack.monitoring.compare import profile, render
    from trainstack.monitoring.compare.comparison import Comparison
    from trainstack.write_failure import write_atomically

    config = TuneConfig(
        source=args.source,
        write=args.write,
        page=args.html,
        steps=args.steps,
        min_rounds=args.min_rounds,
        max_rounds=args.max_rounds,
        budget_seconds=args.budget,
        scratch=args.scratch,
    )
    bar = TrialBar()
    tuner = Tuner(config, bar)
    try:
        try:
            outcome = tuner.run()
        except TrialFailed as failure:
            print(f"trainstack tune: error: {failure}", file=sys.stderr)
            # Bad input stays bad input (the trainer refused the baseline's config): retrying cannot help
            return EXIT_CONFIG if failure.exit_code == EXIT_CONFIG else EXIT_FAILED
        print(f"baseline verdicts: {', '.join(outcome.verdicts) or 'healthy'}")
        for standing in outcome.standings:
            print(standing.line())
        for refusal in outcome.refused.values():
            print(f"not measured, the trainer refused it: {refusal}")
        if outcome.winner is None:
            print("winner: the baseline (no candidate beat it beyond the noise in every round); nothing written")
        else:
            winner = outcome.winner.candidate
            # The result as compare shows two runs: the last baseline trial against the winner's last trial, named
            # for what they ran (their folders go with the scratch; the page holds all it shows).
            comparison = Comparison(profile.load(outcome.trials["baseline"]), profile.load(outcome.trials[winner.name]))
            labels = ("baseline trial", f"{winner.name} trial")
            print(render.text(comparison, labels))
            _write(config.write, config.baseline().to_dict(), winner.options)
            write_atomically(config.html, render.page(comparison, labels), "tune's comparison page")
            print(
                f"winner: {winner.name}, {outcome.winner.ratio:.2f}x the baseline; written to {config.write} "
                f"(trainstack train --config {config.write} --output-dir RUN_DIR); page: {config.html}"
            )
    finally:
        bar.close()
        tuner.remove_scratch()
    return EXIT_INTERRUPTED if outcome.interrupted else EXIT_OK
