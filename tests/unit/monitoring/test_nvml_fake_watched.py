"""The NVML fake's "watched" process entry without a process: outside a launcher, the entry's own pid and name;
under a launcher that is gone, absent (under a live launcher and `trainstack watch`: tests/process/)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.nvml_fake import listed, name_of
from trainstack.rundir import SUPERVISOR_PID_ENV


def test_outside_a_launcher_the_watched_entry_answers_its_own_pid_and_name(watched_gpu, monkeypatch):
    monkeypatch.delenv(SUPERVISOR_PID_ENV, raising=False)
    assert listed(watched_gpu) == {4242: 70_000, 777: 1_000}
    assert name_of(4242) == "/opt/conda/bin/python"


def test_under_a_launcher_that_is_gone_the_watched_entry_is_not_listed(watched_gpu, monkeypatch):
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    monkeypatch.setenv(SUPERVISOR_PID_ENV, str(pid_max + 1))  # no process can have it
    assert listed(watched_gpu) == {777: 1_000}
    assert name_of(4242) is None and name_of(777) == "/usr/bin/Xorg"
