"""`trainstack watch` instruments the ranks it starts, with no line of the script changed (docs/monitor-your-training.md,
"No line changed").

`bootstrap/sitecustomize.py`, first on the command's PYTHONPATH, notices torch's import in each Python process of the
command; `instrument.py` then decides whether the process is a rank and, in one, drives the loop API
(trainstack/monitor.py) from torch's public hooks. This module is torch-free: watch imports it for the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
"""The folder holding the start-up hook `sitecustomize.py`, put first on the command's PYTHONPATH."""


def instrumented_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with the start-up hook first on PYTHONPATH, before whatever PYTHONPATH the command already had."""
    paths = [str(BOOTSTRAP_DIR), *(path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path)]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
