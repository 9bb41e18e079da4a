"""The run-directory contract against a real run: the typed summary names every key the trainer writes (the
contract on its own: tests/unit/trainstack/test_rundir.py)."""

from __future__ import annotations

import json

import pytest

from trainstack import rundir


@pytest.mark.slow
def test_the_typed_summary_names_every_key_the_trainer_writes(cpu_run):
    written = json.loads((cpu_run / rundir.SUMMARY_FILE).read_text())
    watch_only = {"launcher", "command", "started", "goodput"}  # a watched command's (tests/process/test_user_loop.py)
    not_judged = {"not_judged", "ranks_not_judged"}  # a run whose ranks, or some of them, recorded nothing
    hung = {"hang"}  # a run that ended in a stall (tests/process/test_hang.py)
    assert set(written) == set(rundir.Summary.__annotations__) - watch_only - not_judged - hung
    assert all(set(segment) == set(rundir.Segment.__annotations__) for segment in written["segments"])
