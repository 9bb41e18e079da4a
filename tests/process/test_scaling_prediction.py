"""`trainstack bench scaling --predict` as a command: bad input exits 2 (the ring all-reduce model on figures
whose answer is known: tests/unit/train/test_scaling_prediction.py)."""

from __future__ import annotations

import pytest

from tests.helpers.runs import run_trainstack


@pytest.mark.slow
def test_bad_input_exits_2(tmp_path):
    result = run_trainstack("bench", "scaling", "--predict", str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
