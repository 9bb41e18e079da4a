"""`trainstack doctor`: preflight checks that find what keeps a run from using every GPU, before it starts.

The launcher calls `run_checks(DoctorConfig(...))` and refuses to start ranks when `has_failures(...)`.
"""

from trainstack.train.launcher.doctor.checks import run_checks
from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status, has_failures, render_json, render_table

__all__ = [
    "CheckResult",
    "DoctorConfig",
    "GpuInventory",
    "Status",
    "has_failures",
    "render_json",
    "render_table",
    "run_checks",
]
