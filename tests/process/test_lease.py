"""The run-directory lease against real processes: a SIGKILLed holder taken over at once, and SIGTERM while
waiting (the lease on its own: tests/unit/train/test_lease.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.helpers.lease import lease, snapshot
from tests.helpers.runs import REPO
from trainstack.supervisor.lease import LeaseHeld


@pytest.mark.slow
def test_a_sigkilled_holder_is_taken_over_at_once_and_the_taker_says_so(tmp_path):
    code = (
        "import sys, time; from trainstack.supervisor.lease import RunDirLease; "
        f"RunDirLease({str(tmp_path)!r}, 'killed-run').acquire(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld):
            lease(tmp_path, "new-run").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    said = []
    with lease(tmp_path, "new-run", said=said) as taker:
        taker.acquire()
    assert len(said) == 1 and f"PID {holder.pid} is gone" in said[0] and "run killed-run" in said[0], said


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_lease_leaves_at_once_and_writes_nothing(tmp_path):
    from tests.helpers.runs import FAST, trainstack_command

    with lease(tmp_path, "holder") as held:
        held.acquire()
        before = snapshot(tmp_path)
        waiting = subprocess.Popen(
            trainstack_command("train", "--output-dir", str(tmp_path), *FAST, "--wait-for-lease", "600"),
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = waiting.stderr.readline()
            assert "is in use by" in first and "waiting up to 600 s" in first, first
            waiting.send_signal(signal.SIGTERM)
            assert waiting.wait(timeout=60) == 75
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        assert "stopped by SIGTERM before any rank started" in waiting.stderr.read()
        assert snapshot(tmp_path) == before
