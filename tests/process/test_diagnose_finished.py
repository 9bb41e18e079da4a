"""A finished run's summary.json holds one ceiling per kind, the one its verdicts carry (the judging itself, on
records written by hand: tests/unit/monitoring/test_diagnose_finished.py)."""

import json

import pytest

from trainstack import ceilings
from trainstack.monitoring.diagnose.finished import snapshot_from_records
from trainstack.rundir import RunDir


@pytest.mark.slow
def test_a_finished_runs_summary_holds_one_ceiling_per_kind_equal_to_its_verdicts(cpu_run):
    written = json.loads(RunDir(cpu_run).summary.read_text())
    assert written["judged"] is True and "not_judged" not in written
    judged_by = ceilings.as_json(ceilings.of_ranks(snapshot_from_records(cpu_run).ranks))  # what verdicts carry
    assert judged_by and {kind: c for kind, c in written["ceilings"].items() if kind != ceilings.PAUSES} == judged_by
    pauses = ceilings.of_pauses(written["time_breakdown"])[ceilings.PAUSES].to_dict()
    assert written["ceilings"][ceilings.PAUSES] == pauses
    for verdict in written["verdicts"]:
        assert verdict["ceiling"] == written["ceilings"][verdict["kind"]], verdict
