"""The built wheel installs beside a user's stack: one import package (trainstack), dependencies stated as
ranges, and requirements.lock (what make setup, CI and the image install) inside every range."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.packaging import problems
from tests.helpers.runs import REPO, explain


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # A copy of the sources, so the build's own files (build/, *.egg-info) never land in the checkout.
    src = build / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, explain(result)
    (path,) = out.glob("trainstack-*.whl")
    return path


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def locked(lock: str = "requirements.lock") -> dict[str, str]:
    pins = {}
    for line in (REPO / lock).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


@pytest.mark.slow
def test_the_wheel_installs_one_import_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        names = set(archive.namelist())
    assert tops == {"trainstack"}
    # Every module of the source packages is in it, under its namespaced name, and the NVML fake's host files
    # (monitoring/grafana/build_dashboards.py and monitoring/prometheus/build_rules.py are build scripts, no modules).
    for folder, package in (
        ("train", "trainstack/train"),
        ("monitoring", "trainstack/monitoring"),
        ("supervisor", "trainstack/supervisor"),
        ("commands", "trainstack/commands"),
        ("trainstack", "trainstack"),
    ):
        for path in (REPO / folder).rglob("*.py"):
            if (path.parent / "__init__.py").exists():
                assert f"{package}/{path.relative_to(REPO / folder).as_posix()}" in names, path
    assert "trainstack/monitoring/nvml_fake/hosts/dgx_h100.json" in names


@pytest.mark.slow
def test_no_dependency_is_pinned_and_the_lock_satisfies_every_range(wheel):
    requirements = [Requirement(text) for text in metadata(wheel).get_all("Requires-Dist")]
    runtime = [r for r in requirements if not r.marker]  # extras carry a marker: extra == "dev"
    assert {canonicalize_name(r.name) for r in runtime} >= {
        "torch",
        "accelerate",
        "datasets",
        "prometheus-client",
        "nvidia-ml-py",
    }
    assert problems(runtime, locked()) == []


FRAMEWORKS = ("hf", "lightning")  # the integrations' extras, which the dev lock pins for their tests


@pytest.mark.slow
def test_the_dev_lock_satisfies_the_framework_extras_their_tests_install(wheel):
    requirements = [Requirement(text) for text in metadata(wheel).get_all("Requires-Dist")]
    frameworks = [r for r in requirements if r.marker and any(r.marker.evaluate({"extra": e}) for e in FRAMEWORKS)]
    assert {canonicalize_name(r.name) for r in frameworks} == {"transformers", "lightning"}
    assert problems(frameworks, locked("requirements-dev.lock")) == []
