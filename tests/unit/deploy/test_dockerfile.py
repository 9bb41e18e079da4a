"""docker/Dockerfile and .dockerignore, read statically: hadolint, the settings that matter, the pinned base."""

from __future__ import annotations

import re
import tomllib

from tests.helpers.runs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
# The CUDA version of torch's default (PyPI) Linux wheel, by torch minor release; bump with requirements.lock.
TORCH_PYPI_CUDA = {"2.13": "13.0"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (name, _) in enumerate(steps) if name == "FROM")
    return steps[last_from:]


def build_arg_default(name: str) -> str:
    return next(args.split("=", 1)[1] for op, args in instructions() if op == "ARG" and args.startswith(name + "="))


def test_default_base_is_a_pinned_cuda_runtime_that_matches_the_torch_pin():
    base = build_arg_default("BASE_IMAGE")
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-ubuntu\d+\.\d+", base)
    assert match, f"BASE_IMAGE default {base!r} is not a fully pinned nvidia/cuda runtime tag"
    torch_pin = re.search(r"^torch==(\d+\.\d+)\.", (REPO / "requirements.lock").read_text(), re.M).group(1)
    assert torch_pin in TORCH_PYPI_CUDA, f"torch {torch_pin}: add its PyPI wheel's CUDA version to TORCH_PYPI_CUDA"
    assert f"{match[1]}.{match[2]}" == TORCH_PYPI_CUDA[torch_pin]


def test_build_is_multi_stage_and_the_final_stage_takes_only_the_venv_and_the_wheel():
    stage = final_stage()
    copies = [args for op, args in stage if op == "COPY" and args.startswith("--from=")]
    assert copies == ["--from=builder /opt/venv /opt/venv", "--from=builder /build/wheels /tmp/wheels"]
    assert [args for op, args in instructions() if op == "FROM"] == ["${BASE_IMAGE} AS base", "base AS builder", "base"]


def test_final_stage_runs_as_a_numeric_non_root_user():
    users = [args for op, args in final_stage() if op == "USER"]
    assert users, "the final stage sets no USER: the trainer would run as root"
    user = users[-1]
    if user.startswith("${"):
        user = build_arg_default(user.strip("${}"))
    assert user.isdigit() and int(user) != 0, "USER must be a non-zero UID (Kubernetes runAsNonRoot checks it)"


def test_entrypoint_is_exec_form_trainstack_train_behind_tini():
    entrypoints = [args for op, args in final_stage() if op == "ENTRYPOINT"]
    assert entrypoints == ['["tini", "--", "trainstack", "train"]']


def test_hub_is_offline_by_default_and_overridable():
    env = " ".join(args for op, args in final_stage() if op == "ENV")
    assert "HF_HUB_OFFLINE=1" in env and "HF_DATASETS_OFFLINE=1" in env  # ENV, not baked into code: -e overrides


def test_offline_build_installs_from_the_wheelhouse_only():
    assert build_arg_default("WHEELHOUSE") == ""
    script = (REPO / "docker" / "build-venv.sh").read_text()
    assert "--no-index --find-links" in script
    assert "requirements.lock" in script


def test_every_package_trainstack_ships_is_copied_into_the_build():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["setuptools"]["package-dir"].values())  # the source folders
    sources = [args.split() for op, args in instructions() if op == "COPY" and not args.startswith("--")]
    copied = {source for source, *_, destination in sources if destination == f"/build/src/{source}"}
    assert packages <= copied, f"pyproject.toml ships {sorted(packages - copied)}, which the Dockerfile does not copy"


def test_dockerignore_keeps_the_context_small_and_secrets_out():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".env", "runs"} <= ignored
    copied = {args.split()[0] for op, args in instructions() if op == "COPY" and not args.startswith("--")}
    assert not copied & ignored, "the Dockerfile copies a path .dockerignore leaves out"
