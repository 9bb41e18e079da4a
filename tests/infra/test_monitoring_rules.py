"""promtool on the Prometheus config and rules: the config loads every rule file, the rules are clean, and every
alert's unit tests pass (the rule files read statically: tests/unit/monitoring/test_monitoring_rules.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers.runs import REPO

PROMETHEUS_DIR = REPO / "monitoring/prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
UNIT_TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found: install Debian's `prometheus` package (make system-deps)",
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_promtool
def test_config_is_clean_and_loads_every_rule_file() -> None:
    result = promtool("check", "config", "--lint=all", "--lint-fatal", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout


@pytest.mark.slow
@needs_promtool
def test_rules_are_clean() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", *(str(p) for p in RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@needs_promtool
def test_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", *(str(p) for p in UNIT_TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TEST_FILES)
