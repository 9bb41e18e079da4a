"""compose.yaml against the tools that read it: the compose-spec schema, and docker-compose 1.29 and Compose v2
accept it and refuse to start without a Grafana password (the settings read statically:
tests/unit/deploy/test_compose.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import REPO

COMPOSE_FILE = REPO / "compose.yaml"


def compose_config(command: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`<compose> config` on compose.yaml with only the given variables (an empty --env-file hides any .env)."""
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    return subprocess.run(
        [*command, "--env-file", str(empty_env_file), "--file", str(COMPOSE_FILE), "--profile", "cpu", "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env},
        timeout=60,
    )


def compose_v1() -> list[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose (1.29) not installed (Debian: apt-get install docker-compose)")
    return ["docker-compose"]


def compose_v2() -> list[str]:
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
    ):
        pytest.skip("Compose v2 (the docker compose plugin) not installed")
    return ["docker", "compose"]


@pytest.mark.slow
def test_compose_spec_schema():
    checker = Path(sys.executable).parent / "check-jsonschema"
    if not checker.exists():
        pytest.skip("check-jsonschema not installed (make setup installs it)")
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("compose", [compose_v1, compose_v2], ids=["docker-compose-1.29", "compose-v2"])
def test_compose_accepts_the_file_and_refuses_to_start_without_a_grafana_password(compose, tmp_path):
    command = compose()
    accepted = compose_config(command, tmp_path, GRAFANA_ADMIN_PASSWORD="from-dotenv")
    assert accepted.returncode == 0, accepted.stderr
    config = yaml.safe_load(accepted.stdout)["services"]
    assert set(config) == {"trainer", "trainer-cpu", "prometheus", "grafana"}
    devices = config["trainer"]["deploy"]["resources"]["reservations"]["devices"]
    assert [(d["driver"], d["capabilities"], d["count"] in ("all", -1)) for d in devices] == [("nvidia", ["gpu"], True)]
    refused = compose_config(command, tmp_path)
    assert refused.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in refused.stderr + refused.stdout
