"""The problem registry (trainstack/problems.py), walked: which kinds have which parts, exactly, and that every place
that names a problem reads it: diagnose's checks and verdict kinds, the alert rules, the thresholds, the ceilings and
tune's candidates."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re

import yaml

from tests.helpers.runs import REPO
from trainstack import ceilings, problems, thresholds
from trainstack.commands.tune import candidates
from trainstack.monitoring.diagnose import verdicts
from trainstack.problems import PROBLEMS
from trainstack.train.rank.config import TrainConfig, _flag

ROOT = REPO
ALERTS_FILE = ROOT / "monitoring/prometheus/rules/alerts.yml"
VERDICTS_FILE = ROOT / "monitoring/diagnose/verdicts.py"


def kinds_with(part: str) -> set[str]:
    return {kind for kind, problem in PROBLEMS.items() if getattr(problem, part)}


def rule_file_alerts() -> list[str]:
    groups = yaml.safe_load(ALERTS_FILE.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_each_kind_is_its_own_constant_and_entry():
    for kind, problem in PROBLEMS.items():
        assert problem.kind == kind
        assert getattr(problems, kind.upper().replace("-", "_")) == kind


def test_which_kinds_have_which_parts():
    alert_only = {problems.XID, problems.EXPORTER_DOWN, problems.NVML_UNAVAILABLE}
    judged = set(PROBLEMS) - alert_only - {problems.PAUSES}
    assert kinds_with("detection") == judged
    assert set(PROBLEMS) - kinds_with("thresholds") == alert_only | {problems.PAUSES}
    assert kinds_with("alerts") == set(PROBLEMS) - {
        problems.NO_TRAINING,
        problems.NO_STEP_YET,
        problems.LOW_MFU,
        problems.PAUSES,
    }
    assert kinds_with("fix") == set(PROBLEMS) - {problems.PAUSES}
    time_shares = {problems.INPUT_BOUND, problems.STRAGGLER, problems.COMM_BOUND, problems.HOST_BOUND}
    assert kinds_with("gain") == time_shares | {problems.PAUSES}
    assert kinds_with("figures") == time_shares | {problems.THROTTLED, problems.MEMORY_FULL}
    assert kinds_with("tune") == time_shares


def test_every_verdict_kind_has_a_problem_and_every_check_finds_one():
    """verdicts.py writes each kind as its constant; each problem's detection is a check diagnose runs."""
    tree = ast.parse(VERDICTS_FILE.read_text())
    written = {
        getattr(problems, node.args[0].attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict"
    }
    assert written == kinds_with("detection")
    checks = {check.__name__ for check in verdicts.CHECKS}
    assert {problem.detection for problem in PROBLEMS.values() if problem.detection} == checks


def test_every_alert_of_the_rule_files_belongs_to_one_kind_and_back():
    listed = [alert for problem in PROBLEMS.values() for alert in problem.alerts]
    assert len(listed) == len(set(listed)), "an alert listed by two problems"
    assert sorted(rule_file_alerts()) == sorted(listed)
    for kind, problem in PROBLEMS.items():
        assert all(problems.of_alert(alert) is problem for alert in problem.alerts), kind


def test_each_alert_says_its_problems_fix():
    """The alerts' fix is the verdict's, in trainstack train's words; two carry their own, for the reason the
    Alert's `fix` says."""
    own = set()
    for group in yaml.safe_load(ALERTS_FILE.read_text())["groups"]:
        for rule in group["rules"]:
            fix = problems.of_alert(rule["alert"]).fix
            if not rule["annotations"]["description"].endswith(f" Fix: {fix.train}."):
                own.add(rule["alert"])
    assert own == {"TrainstackRankHung", "TrainstackGPUUnderused"}


def test_every_threshold_belongs_to_a_problem_and_its_alert_to_that_problem():
    owners = {t.name: [p for p in PROBLEMS.values() if t in p.thresholds] for t in thresholds.THRESHOLDS}
    assert all(owners.values()), f"thresholds no problem reads: {[n for n, o in owners.items() if not o]}"
    for threshold in thresholds.THRESHOLDS:
        if threshold.alert:
            assert any(threshold.alert in p.alerts for p in owners[threshold.name]), threshold.name


def test_a_fix_that_names_a_train_flag_has_a_watched_scripts_words():
    """A watched script has no `trainstack train` flag: a fix that names one says the script's own knob beside it.
    --collective-timeout, which the hang kinds name for a run that `trainstack train` started, is the one left."""
    train_flags = {_flag(field.name) for field in dataclasses.fields(TrainConfig)} - {"--collective-timeout"}
    for kind, problem in PROBLEMS.items():
        if problem.fix is None:
            continue
        named = set(re.findall(r"--[a-z][a-z-]+", problem.fix.train)) & train_flags
        assert bool(named) == (problem.fix.script is not None), (kind, named)
        if problem.fix.script is not None:
            assert not set(re.findall(r"--[a-z][a-z-]+", problem.fix.script)) & train_flags, kind
    assert {kind for kind, p in PROBLEMS.items() if p.fix and p.fix.script} == {
        problems.INPUT_BOUND,
        problems.COMM_BOUND,
        problems.HOST_BOUND,
        problems.GPU_UNDERUSED,
        problems.NO_TENSOR_CORES,
        problems.MEMORY_FULL,
        problems.LOW_MFU,
    }


def test_a_fix_speaks_to_whoever_started_the_ranks():
    fix = PROBLEMS[problems.INPUT_BOUND].fix
    assert fix.words(["train", "train"]) == fix.train
    assert fix.words(["train", "watch"]) == fix.words([]) == fix.script
    assert PROBLEMS[problems.THROTTLED].fix.words(["watch"]) == PROBLEMS[problems.THROTTLED].fix.train


def test_the_ceiling_rules_are_the_registrys():
    assert ceilings.WHAT_FIX_GAINS == {
        kind: (p.gain.what, p.gain.fix) for kind, p in PROBLEMS.items() if p.gain is not None
    }
    for kind in ceilings.WHAT_FIX_GAINS:
        assert ceilings.ceiling(kind, 0.5).text.startswith(f"{kind}: ")


def test_tune_tries_for_each_kind_the_options_its_problem_lists():
    """Over configs that open every branch of the candidates, each kind's candidates change exactly the options its
    problem lists: none beside them, and none listed that no candidate tries."""
    assert set(candidates.FIXES) == kinds_with("tune")
    configs = [
        TrainConfig(num_workers=workers, grad_accum=accum, batch_size=8, ddp_static_graph=static, strategy=strategy)
        for workers, accum, static, strategy in itertools.product((0, 1), (1, 2), (False, True), ("ddp", "fsdp"))
        if not static or (accum == 1 and strategy == "ddp")  # the pairs the config refuses
    ]
    for kind, fixes in candidates.FIXES.items():
        tried = {
            option
            for config, on_cuda in itertools.product(configs, (False, True))
            for candidate in fixes(dataclasses.replace(config, pin_memory=False, persistent_workers=False), on_cuda)
            for option in candidate.options
        }
        assert tried == set(PROBLEMS[kind].tune), kind
