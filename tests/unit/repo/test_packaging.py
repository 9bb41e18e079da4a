"""The check on pyproject.toml's ranges and requirements.lock on given requirements: a pin, an open range and a
lock outside the range are caught (the built wheel: tests/process/test_packaging.py)."""

from __future__ import annotations

from packaging.requirements import Requirement

from tests.helpers.packaging import problems


def test_a_pin_an_open_range_and_a_lock_outside_the_range_are_caught():
    pins = {"torch": "2.13.0", "tqdm": "4.70.1", "psutil": "7.2.2"}
    planted = [Requirement("torch==2.13.0"), Requirement("tqdm"), Requirement("psutil>=8"), Requirement("h11>=0.14")]
    assert problems(planted, pins) == [
        "torch==2.13.0 pins one version",
        "tqdm states no range",
        "requirements.lock pins psutil==7.2.2, outside >=8",
        "h11 is not in requirements.lock",
    ]
