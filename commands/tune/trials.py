"""The trials: bounded `trainstack train` runs on the same hardware and data, one after another (on a small host two
side by side would measure each other), timed after warm-up from their own records. Each round runs the baseline,
then every candidate still undecided, so a ratio per candidate per round compares trials minutes apart at most and
slow drift of the host cancels out of the geometric mean. What the host alone moves a ratio is measured too: the
baseline's own samples/s across rounds, nothing changed. A candidate beats the baseline only where every round's
ratio stands beyond that spread (and beyond MIN_GAIN): with a bare "every round above 1", a candidate that changes
nothing won a quarter of two-round tunes on noise alone."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainstack.commands.tune.candidates import BASELINE, Candidate, for_verdicts
from trainstack.commands.tune.config import TuneConfig
from trainstack.errors import EXIT_CONFIG
from trainstack.monitoring.compare import profile
from trainstack.train.rank.config import ranks_use_cuda

MIN_GAIN = 1.05
"""The least ratio tune calls a gain: on a shared host two runs of one config differ by this much in a few trials
(bench/side_by_side.py's pairs spread 0.87-1.04 with nothing changed), so a smaller gain is not measured."""


class TrialFailed(Exception):
    """A trial exited non-zero (`exit_code`); the message has the end of its output."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class CandidateRefused(TrialFailed):
    """A candidate's trial exited as bad input does (EXIT_CONFIG): the trainer refused the setting for this model
    or host (DDP's static graph for an output it cannot flatten, say). Another candidate may still apply."""


@dataclass
class Standing:
    """A candidate's rounds so far: its ratio to the baseline of the same round, and that baseline's samples/s."""

    candidate: Candidate
    ratios: list[float] = field(default_factory=list)
    steps_per_second: list[float] = field(default_factory=list)
    baseline_samples_per_second: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.geometric_mean(self.ratios)

    @property
    def noise(self) -> float:
        """How far the host alone moved the baseline over these rounds (its fastest over its slowest samples/s; 1
        after one round), floored at MIN_GAIN: a ratio within it may be drift."""
        rates = self.baseline_samples_per_second
        return max(MIN_GAIN, max(rates) / min(rates) if rates else 1.0)

    @property
    def faster(self) -> bool:
        return bool(self.ratios) and min(self.ratios) > self.noise

    @property
    def slower(self) -> bool:
        return bool(self.ratios) and max(self.ratios) < 1 / self.noise

    @property
    def clear(self) -> bool:
        """Every round beyond the noise on one side: its effect stands clear of it."""
        return self.faster or self.slower

    def line(self) -> str:
        verdict = "faster" if self.faster else "slower" if self.slower else "within the noise"
        return (
            f"{self.candidate.name:<20} {statistics.median(self.steps_per_second):7.2f} steps/s  "
            f"{self.ratio:.3f}x the baseline (samples/s, geometric mean of {len(self.ratios)} rounds, spread "
            f"{min(self.ratios):.3f}-{max(self.ratios):.3f}; noise {self.noise:.3f}): {verdict}"
        )


@dataclass
class Outcome:
    verdicts: dict[str, str]
    standings: list[Standing]
    winner: Standing | None
    """The fastest candidate whose every round beat the baseline beyond the noise; None: keep the baseline."""
    trials: dict[str, Path]
    """Candidate name -> its latest trial's run directory (in the scratch folder)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Candidate name -> why the trainer refused it (CandidateRefused); it is not measured."""
    interrupted: bool = False


class Progress(Protocol):
    """What the user sees of the trials (cli.TrialBar): each trial as it starts and, about once a second, while it
    runs; a line when it ends."""

    def started(self, number: int, name: str, planned: int) -> None:
        """Trial `number` of at most `planned` (the rounds may end sooner) starts, running `name`."""

    def running(self) -> None: ...

    def ended(self, line: str) -> None: ...


class Tuner:
    def __init__(self, config: TuneConfig, progress: Progress):
        self.config, self.progress = config, progress
        self.planned = 1  # trials at most: the diagnosing baseline until it has brought the candidates
        self.started = time.monotonic()
        self.count = 0
        self.scratch = Path(tempfile.mkdtemp(prefix="trainstack-tune-", dir=config.scratch))
        self.base = self.scratch / "baseline.yaml"
        config.baseline().save(self.base)

    def trial(self, candidate: Candidate) -> profile.RunProfile:
        self.count += 1
        run_dir = self.scratch / f"trial-{self.count:02d}"
        command = [
            sys.executable,
            "-m",
            "trainstack",
            "train",
            "--config",
            str(self.base),
            "--output-dir",
            str(run_dir),
            "--max-steps",
            str(self.config.steps),
            "--log-every",
            str(self.config.steps // 5),
            # A trial measures speed: a checkpoint or an evaluation at its end (a real model's optimizer state, a
            # real data set's held-out share) could take longer than its steps, and no one would read either.
            "--checkpoint-every",
            "0",
            "--keep-checkpoints",
            "0",
            "--eval-fraction",
            "0",
            "--resume",
            "never",
            "--exporter-port",
            "0",
            "--no-report",
            *candidate.flags,
        ]
        self.progress.started(self.count, candidate.name, self.planned)
        trial = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while True:
                try:
                    _, stderr = trial.communicate(timeout=1)
                    break
                except subprocess.TimeoutExpired:
                    self.progress.running()
        except BaseException:  # Ctrl-C: the trial ends with the tuner, as subprocess.run would end it
            trial.kill()
            trial.wait()
            raise
        if trial.returncode:
            refused = trial.returncode == EXIT_CONFIG and candidate is not BASELINE
            raise (CandidateRefused if refused else TrialFailed)(
                f"trial {self.count} ({candidate.name}) exited {trial.returncode}: "
                f"{stderr.strip().splitlines()[-1] if stderr.strip() else ''}",
                trial.returncode,
            )
        measured = profile.load(run_dir)
        # --steps of at least 10 at 5 log intervals: a trial that exited 0 has intervals past its first to time
        assert measured.rate is not None, "a finished trial has a steady rate"
        self.progress.ended(
            f"tune: trial {self.count} {candidate.name}: {measured.rate.steps_per_second:.2f} steps/s, "
            f"{measured.rate.samples_per_second:.1f} samples/s ({time.monotonic() - self.started:.0f} s into tune)"
        )
        return measured

    def run(self) -> Outcome:
        trials: dict[str, Path] = {}
        standings: list[Standing] = []
        verdicts: dict[str, str] = {}
        refused: dict[str, str] = {}
        try:
            baseline = self.trial(BASELINE)  # the diagnosing trial is the first round's baseline
            verdicts = baseline.verdicts
            candidates = for_verdicts(list(verdicts), self.config.baseline(), ranks_use_cuda())
            standings = [Standing(c) for c in candidates]
            self.planned = self.config.max_rounds * (1 + len(candidates))
            for round_number in range(self.config.max_rounds):
                undecided = [
                    s for s in standings if not (round_number >= self.config.rounds_before_deciding and s.clear)
                ]
                if not undecided or (round_number and time.monotonic() - self.started > self.config.budget_seconds):
                    break
                if round_number:
                    baseline = self.trial(BASELINE)
                trials[BASELINE.name] = baseline.run_dir
                for standing in undecided:
                    try:
                        measured = self.trial(standing.candidate)
                    except CandidateRefused as refusal:
                        refused[standing.candidate.name] = str(refusal)
                        standings.remove(standing)
                        continue
                    trials[standing.candidate.name] = measured.run_dir
                    rate, baseline_rate = measured.rate, baseline.rate
                    assert rate is not None and baseline_rate is not None, "trial() returns timed trials"
                    standing.ratios.append(rate.samples_per_second / baseline_rate.samples_per_second)
                    standing.steps_per_second.append(rate.steps_per_second)
                    standing.baseline_samples_per_second.append(baseline_rate.samples_per_second)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        timed = [s for s in standings if s.ratios]
        winners = [s for s in timed if s.faster]
        winner = max(winners, key=lambda s: s.ratio, default=None)
        return Outcome(verdicts, timed, winner, trials, refused, interrupted)

    def remove_scratch(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
