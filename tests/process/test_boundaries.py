"""The package boundaries that need an interpreter of their own: the exporter and diagnose never import torch,
checked by importing every module in a fresh process, and the check catching a planted import (the boundaries
read on the source: tests/unit/repo/test_boundaries.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO
from tests.helpers.source_tree import plant, project_modules, within_any

# The processes that must stay torch-free: every module of these packages, __main__ aside (it runs the command).
TORCH_FREE = {
    folder: f"trainstack.{folder.replace('/', '.')}"
    for folder in ("monitoring/exporter", "monitoring/diagnose", "monitoring/report")
}
TORCH_FREE["trainstack"] = "trainstack"
# The supervisor and the commands run once per node beside the ranks, watch's beside any command: torch is the ranks'.
TORCH_FREE["supervisor"] = "trainstack.supervisor"
TORCH_FREE["commands"] = "trainstack.commands"


# The trainstack modules that run in a training rank, where torch is: the loop API, its telemetry, the integrations,
# and watch's instrumentation, which its start-up hook (torch-free itself) loads once torch is imported.
RANK_SIDE = ("trainstack.monitor", "trainstack.telemetry", "trainstack.integrations", "trainstack.auto.instrument")


def torch_importers(root: Path, layout=TORCH_FREE) -> list[str]:
    """Imports every module of the layout's folders in a fresh interpreter (cwd: root) and returns the torch
    modules that ended up in sys.modules."""
    names = [
        name
        for name in project_modules(root, layout)
        if not name.endswith("__main__") and not within_any(name, RANK_SIDE)
    ]
    script = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


# ---- the project ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_exporter_and_diagnose_never_import_torch():
    assert len(project_modules(REPO, TORCH_FREE)) > 25  # they were all found
    assert torch_importers(REPO) == []


@pytest.mark.slow
def test_a_planted_torch_import_is_caught(tmp_path):
    # A stand-in torch: the check looks at sys.modules, so the real one need not load. The planted tree is laid
    # out as it installs (trainstack/monitoring/...), so it imports from its own folder.
    root = plant(
        tmp_path,
        {
            "torch.py": "",
            "trainstack/monitoring/__init__.py": "",
            "trainstack/monitoring/exporter/__init__.py": "",
            "trainstack/monitoring/exporter/cli.py": "def run():\n    import torch\n",
            "trainstack/monitoring/diagnose/__init__.py": "",
            "trainstack/monitoring/diagnose/verdicts.py": "from trainstack import rundir\n",
            "trainstack/rundir.py": "import torch\n",
        },
    )
    # Found through trainstack, not through the lazy import that never ran.
    assert torch_importers(root, layout={"trainstack": "trainstack"}) == ["torch"]
