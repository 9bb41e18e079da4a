"""`trainstack tune`: bad input in one line with exit 2, the candidates each verdict brings, the rule that a gain must
stand beyond the baseline's own spread, and (slow) real 2-rank CPU runs: a loader slowed on purpose, where tune must
pick more loader workers with every round's ratio above 1 and its mean above 1.2, leave the source untouched and its
scratch folder removed, and write the baseline against the winner as compare's page; a delayed all-reduce, where a
comm-bound fix must win; a healthy run, where none may."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from types import SimpleNamespace

import pytest

from trainstack.commands import cli
from trainstack.commands.tune.candidates import BASELINE, for_verdicts
from trainstack.commands.tune.config import TuneConfig
from trainstack.commands.tune.trials import Standing, Tuner
from trainstack.errors import EXIT_CONFIG
from trainstack.monitoring.compare import profile
from trainstack.train.launcher import launch_config
from trainstack.train.rank.config import TrainConfig, from_sources


@pytest.mark.parametrize(
    "case", ["missing", "not-a-run", "written-exists", "page-exists", "bad-key", "no-such-folder", "scratch-a-file"]
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\n" if case != "bad-key" else "num_wrokers: 1\n")
    # Where the result goes is checked before any trial runs, not after them
    write = tmp_path / ("nowhere/tuned.yaml" if case == "no-such-folder" else "tuned.yaml")
    scratch = ["--scratch", str(source)] if case == "scratch-a-file" else []
    if case in ("written-exists", "page-exists"):
        write.with_suffix(".yaml" if case == "written-exists" else ".html").write_text("kept: yes\n")
    given = {"missing": tmp_path / "nowhere.yaml", "not-a-run": tmp_path}.get(case, source)
    assert cli.main(["tune", str(given), "--write", str(write), *scratch]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    if case in ("written-exists", "page-exists"):
        assert next(tmp_path.glob("tuned.*")).read_text() == "kept: yes\n"


def test_max_rounds_alone_sets_how_many_rounds_and_a_minimum_above_it_is_one_line(tmp_path, capsys):
    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\n")
    config = TuneConfig(source=source, write=tmp_path / "tuned.yaml", max_rounds=1)
    assert config.rounds_before_deciding == 1  # the default 2 yields to it
    assert TuneConfig(source=source, write=tmp_path / "tuned.yaml").rounds_before_deciding == 2
    given = ["tune", str(source), "--write", str(tmp_path / "tuned.yaml"), "--min-rounds", "3", "--max-rounds", "2"]
    assert cli.main(given) == EXIT_CONFIG
    assert "need 1 <= --min-rounds <= --max-rounds, got 3 and 2" in capsys.readouterr().err


def test_each_verdict_brings_its_own_fixes():
    config = TrainConfig(num_workers=1, grad_accum=1, batch_size=8)

    def names(kinds: list[str], on_cuda: bool = False, **options) -> list[str]:
        return [c.name for c in for_verdicts(kinds, dataclasses.replace(config, **options), on_cuda)]

    assert names(["input-bound"])[0] == "num_workers=2"
    assert names(["input-bound"])[-1] == "prefetch_factor=4"
    # pinning only where a copy to a GPU can use it; persistent workers only where the baseline lacks them
    assert {"pin_memory", "persistent_workers"} & set(names(["input-bound"])) == set()
    assert {"pin_memory", "persistent_workers"} <= set(
        names(["input-bound"], on_cuda=True, pin_memory=False, persistent_workers=False)
    )
    assert "prefetch_factor=4" not in names(["input-bound"], num_workers=0)  # no workers: nothing prefetches
    assert names(["comm-bound"]) == ["grad_accum=2", "ddp_bucket_cap_mb=100", "ddp_static_graph"]
    assert names(["comm-bound"], on_cuda=True)[-1] == "ddp_comm_hook=bf16"  # DDP allows bf16 over NCCL only
    assert names(["comm-bound"], grad_accum=2) == ["grad_accum=4", "ddp_bucket_cap_mb=100"]  # static: no no_sync
    assert names(["comm-bound"], strategy="fsdp") == ["grad_accum=2"]  # FSDP has none of DDP's options
    assert names(["host-bound"]) == ["batch_size=16", "compile"]
    assert len(names([])) == 1  # healthy: one check that nothing is left to gain
    for candidate in for_verdicts(["input-bound", "comm-bound", "host-bound"], config, on_cuda=True):
        dataclasses.replace(config, **candidate.options)  # each one a config the app takes


def test_a_candidate_wins_only_beyond_the_baselines_own_spread():
    # The baseline moved 1.2x between rounds with nothing changed: rounds of 1.15x are drift, 1.3x are a gain.
    drift = Standing(BASELINE, ratios=[1.15, 1.15], steps_per_second=[1, 1], baseline_samples_per_second=[10, 12])
    gain = Standing(BASELINE, ratios=[1.3, 1.3], steps_per_second=[1, 1], baseline_samples_per_second=[10, 12])
    assert not drift.faster and not drift.clear and "within the noise" in drift.line()
    assert gain.faster and gain.line().endswith("noise 1.200): faster")
    # One round: no spread measured yet, so no gain below MIN_GAIN counts.
    assert not Standing(BASELINE, ratios=[1.03], steps_per_second=[1], baseline_samples_per_second=[10]).faster


class TrialProcess:
    """Stands in for a trial's `trainstack train`: still running at its first two polls, or interrupted (Ctrl-C)."""

    killed = False

    def __init__(self, command, **kwargs):
        self.polls, self.returncode = 0, None

    def communicate(self, timeout):
        self.polls += 1
        if self.polls == 3:
            if TrialProcess.interrupt:
                raise KeyboardInterrupt
            self.returncode = 0
            return "", ""
        raise subprocess.TimeoutExpired("trainstack", timeout)

    def kill(self):
        TrialProcess.killed = True

    def wait(self):
        return self.returncode


class SeenProgress:
    def __init__(self):
        self.calls = []

    def started(self, number, name, planned):
        self.calls.append(("started", number, name, planned))

    def running(self):
        self.calls.append(("running",))

    def ended(self, line):
        self.calls.append(("ended", line.split(":")[0]))


@pytest.mark.parametrize("interrupt", [False, True])
def test_the_progress_shows_each_trial_while_it_runs_and_ctrl_c_ends_it(tmp_path, monkeypatch, interrupt):
    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\n")
    monkeypatch.setattr(subprocess, "Popen", TrialProcess)
    monkeypatch.setattr(TrialProcess, "interrupt", interrupt, raising=False)
    monkeypatch.setattr(TrialProcess, "killed", False)
    rate = profile.Rate(steps_per_second=2.0, samples_per_second=32.0)
    monkeypatch.setattr(profile, "load", lambda run_dir: SimpleNamespace(rate=rate, run_dir=run_dir))
    seen = SeenProgress()
    tuner = Tuner(TuneConfig(source=source, write=tmp_path / "tuned.yaml", scratch=tmp_path), seen)
    try:
        if interrupt:
            with pytest.raises(KeyboardInterrupt):
                tuner.trial(BASELINE)
        else:
            tuner.trial(BASELINE)
    finally:
        tuner.remove_scratch()
    started = [("started", 1, "baseline", 1), ("running",), ("running",)]  # a tick at each poll it still ran
    assert seen.calls == started + ([] if interrupt else [("ended", "tune")])
    assert TrialProcess.killed is interrupt  # an interrupted trial is ended with the tuner, a finished one is not


def test_a_trial_as_train_parses_it_saves_no_checkpoint_and_evaluates_nothing(tmp_path, monkeypatch):
    """A trial measures speed: its end-of-run checkpoint (a real model's optimizer state) or evaluation (a real data
    set's held-out share) could outlast its steps, and the scratch folder takes both away unread."""
    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\ncheckpoint_every: 50\neval_every: 5\n")
    commands = []

    class Finished:
        returncode = 0

        def __init__(self, command, **kwargs):
            commands.append(command)

        def communicate(self, timeout):
            return "", ""

    monkeypatch.setattr(subprocess, "Popen", Finished)
    rate = profile.Rate(steps_per_second=2.0, samples_per_second=32.0)
    monkeypatch.setattr(profile, "load", lambda run_dir: SimpleNamespace(rate=rate, run_dir=run_dir))
    tuner = Tuner(TuneConfig(source=source, write=tmp_path / "tuned.yaml", scratch=tmp_path), SeenProgress())
    try:
        tuner.trial(BASELINE)
        parser = argparse.ArgumentParser()
        launch_config.add_arguments(parser)
        (command,) = commands
        trial = from_sources(parser.parse_args(command[command.index("train") + 1 :]), on_cuda=False)
    finally:
        tuner.remove_scratch()
    assert (trial.keep_checkpoints, trial.checkpoint_every, trial.eval_fraction) == (0, 0, 0)
    assert (trial.num_workers, trial.resume) == (1, "never")  # the baseline's own options, and no resume


class RefusingTrial:
    """Stands in for a trial's `trainstack train`: the static graph is refused as bad input (an output DDP cannot
    flatten, tests/process/test_train_faults.py), every other setting runs."""

    def __init__(self, command, **kwargs):
        self.returncode = EXIT_CONFIG if "--ddp-static-graph" in command else 0

    def communicate(self, timeout):
        return "", "" if self.returncode == 0 else "trainstack train: error: the ranks' weights differ ...\n"


def test_a_candidate_the_trainer_refuses_is_left_out_and_the_others_are_measured(tmp_path, monkeypatch):
    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\n")
    monkeypatch.setattr(subprocess, "Popen", RefusingTrial)
    rate = profile.Rate(steps_per_second=2.0, samples_per_second=32.0)
    monkeypatch.setattr(
        profile, "load", lambda run_dir: SimpleNamespace(rate=rate, run_dir=run_dir, verdicts={"comm-bound": "..."})
    )
    tuner = Tuner(
        TuneConfig(source=source, write=tmp_path / "tuned.yaml", scratch=tmp_path, max_rounds=2), SeenProgress()
    )
    try:
        outcome = tuner.run()
    finally:
        tuner.remove_scratch()
    assert list(outcome.refused) == ["ddp_static_graph"]
    assert "exited 2: trainstack train: error: the ranks' weights differ" in outcome.refused["ddp_static_graph"]
    assert [s.candidate.name for s in outcome.standings] == ["grad_accum=2", "ddp_bucket_cap_mb=100"]
    assert all(len(s.ratios) == 2 for s in outcome.standings)  # both rounds ran without the refused one


@pytest.mark.parametrize("trial_code, tune_code", [(EXIT_CONFIG, EXIT_CONFIG), (1, 1)])
def test_a_baseline_the_trainer_refuses_as_bad_input_ends_tune_as_bad_input(
    tmp_path, monkeypatch, capsys, trial_code, tune_code
):
    class FailingBaseline:
        returncode = trial_code

        def __init__(self, command, **kwargs):
            pass

        def communicate(self, timeout):
            return "", "trainstack train: error: dataset factory 'mine:build' returned 0 samples\n"

    source = tmp_path / "base.yaml"
    source.write_text("num_workers: 1\n")
    monkeypatch.setattr(subprocess, "Popen", FailingBaseline)
    assert cli.main(["tune", str(source), "--write", str(tmp_path / "tuned.yaml")]) == tune_code
    error = capsys.readouterr().err
    assert f"trial 1 (baseline) exited {trial_code}: trainstack train: error: dataset factory" in error
