"""How often `trainstack tune` crowns a candidate that changes nothing, and one that gains: tune's own rounds and
rule (commands/tune/trials.py's Tuner.run and Standing) on simulated trials, whose samples/s differ by the host
alone, log-normal with a spread of SIGMA, for the candidate as for the baseline; the candidate's true gain is GAIN
(1: it changes nothing). A healthy baseline, so its one candidate is the loader's first fix, as in a real tune of a
healthy run. Also the trials a tune ran, on average.

    .venv/bin/python bench/tune_false_wins.py [--tunes 4000] [--sigma 0.04 0.06 0.1] [--gain 1 1.1 1.2]

On this machine the same 2-rank trial's samples/s moved by about 6% from trial to trial (four baselines of one tune:
236.7-273.6 samples/s)."""

from __future__ import annotations

import argparse
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainstack.commands.tune.candidates import BASELINE, Candidate
from trainstack.commands.tune.config import TuneConfig
from trainstack.commands.tune.trials import Tuner


@dataclass
class Rate:
    samples_per_second: float
    steps_per_second: float


@dataclass
class Trial:
    rate: Rate
    run_dir: Path
    verdicts: dict[str, str]


class Silent:
    def started(self, number: int, name: str, planned: int) -> None: ...

    def running(self) -> None: ...

    def ended(self, line: str) -> None: ...


class SimulatedTuner(Tuner):
    """Tune's rounds and rule, each trial's samples/s drawn instead of measured."""

    def __init__(self, config: TuneConfig, sigma: float, gain: float, draw: random.Random):
        super().__init__(config, Silent())
        self.sigma, self.gain, self.draw = sigma, gain, draw

    def trial(self, candidate: Candidate) -> Trial:  # type: ignore[override]
        self.count += 1
        rate = 100 * (1 if candidate is BASELINE else self.gain) * self.draw.lognormvariate(0, self.sigma)
        return Trial(Rate(rate, rate / 16), self.scratch, {})


def simulated(source: Path, rounds: tuple[int, int], sigma: float, gain: float, tunes: int) -> tuple[float, float]:
    """(the share of `tunes` simulated tunes the candidate won, the trials a tune ran on average)."""
    draw, wins, trials = random.Random(f"{rounds} {sigma} {gain}"), 0, 0
    with tempfile.TemporaryDirectory() as scratch:
        config = TuneConfig(
            source, Path(scratch) / "tuned.yaml", min_rounds=rounds[0], max_rounds=rounds[1], scratch=Path(scratch)
        )
        for _ in range(tunes):
            tuner = SimulatedTuner(config, sigma, gain, draw)
            try:
                wins += tuner.run().winner is not None
            finally:
                tuner.remove_scratch()
            trials += tuner.count
    return wins / tunes, trials / tunes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tunes", type=int, default=4000)
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.04, 0.06, 0.1])
    parser.add_argument("--gain", type=float, nargs="+", default=[1.0, 1.1, 1.2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "base.yaml"
        source.write_text("batch_size: 8\nnum_workers: 2\n")
        for rounds in ((2, 3), (3, 3)):
            for gain in args.gain:
                for sigma in args.sigma:
                    won, trials = simulated(source, rounds, sigma, gain, args.tunes)
                    print(
                        f"--min-rounds {rounds[0]} --max-rounds {rounds[1]}, a candidate of {gain:.2f}x, trials "
                        f"moved {sigma:.0%} by the host: it wins {won:.1%} of {args.tunes} tunes, "
                        f"{trials:.1f} trials a tune",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
