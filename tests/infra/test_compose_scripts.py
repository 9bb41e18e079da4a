"""scripts/compose-*.sh (make up/down/logs/ps) against a stand-in `docker` that records its calls: the password
in .env, the GPU/CPU choice, the services started, the wait for the trainer and the URLs printed. The compose file
itself is checked in test_compose.py and the image on a real engine in test_docker_image.py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

pytestmark = pytest.mark.slow

STAND_IN_DOCKER = r"""#!/usr/bin/env bash
echo "$*" >> "$DOCKER_CALLS"
case "$*" in
  "info --format {{json .Runtimes}}") echo "$RUNTIMES" ;;
  info) ;;
  "compose version") ;;
  *" ps --all --quiet "*) echo container-id ;;
  inspect*) echo "$TRAINER_STATE" ;;
  *" logs "*) echo "trainer log line" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The scripts in a scratch checkout (they write .env next to compose.yaml) and docker on PATH."""
    (tmp_path / "scripts").mkdir()
    for script in (REPO / "scripts").glob("compose-*.sh"):
        shutil.copy(script, tmp_path / "scripts")
    shutil.copy(REPO / "compose.yaml", tmp_path)
    (tmp_path / "bin").mkdir()
    docker = tmp_path / "bin" / "docker"
    docker.write_text(STAND_IN_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def run_script(
    checkout: Path, name: str, *args: str, runtimes: str = '{"runc":{}}', state: str = "running healthy 0", **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = checkout / "calls.log"
    calls.write_text("")
    environment = {
        "PATH": f"{checkout / 'bin'}:/usr/bin:/bin",
        "HOME": str(checkout),
        "DOCKER_CALLS": str(calls),
        "RUNTIMES": runtimes,
        "TRAINER_STATE": state,
        **env,
    }
    result = subprocess.run(
        ["bash", str(checkout / "scripts" / name), *args], env=environment, capture_output=True, text=True, timeout=60
    )
    return result, calls.read_text().splitlines()


def dotenv(checkout: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (checkout / ".env").read_text().splitlines() if "=" in line)


def test_up_without_nvidia_runtime_starts_the_cpu_trainer_with_a_fresh_password(checkout):
    result, calls = run_script(checkout, "compose-up.sh")
    assert result.returncode == 0, result.stderr
    settings = dotenv(checkout)
    password = settings["GRAFANA_ADMIN_PASSWORD"]
    assert len(password) >= 32 and password not in result.stdout, "generated, long, and never printed"
    assert stat.S_IMODE((checkout / ".env").stat().st_mode) == 0o600
    assert settings["COMPOSE_PROJECT_NAME"] == "trainstack"
    assert "no NVIDIA runtime: training on 2 CPU ranks, service trainer-cpu" in result.stdout
    assert "compose --project-name trainstack --profile cpu rm --stop --force trainer" in calls
    assert "compose --project-name trainstack --profile cpu up --detach --build trainer-cpu prometheus grafana" in calls
    for url in ("http://127.0.0.1:3000", "http://127.0.0.1:9090", "http://127.0.0.1:9450/metrics"):
        assert url in result.stdout
    assert f"GRAFANA_ADMIN_PASSWORD in {checkout}/.env" in result.stdout


def test_up_with_nvidia_runtime_starts_the_gpu_trainer_and_keeps_an_existing_password(checkout):
    (checkout / ".env").write_text("GRAFANA_ADMIN_PASSWORD=chosen-by-me\nGRAFANA_PORT=3300")  # no final newline
    result, calls = run_script(checkout, "compose-up.sh", runtimes='{"nvidia":{"path":"nvidia-container-runtime"}}')
    assert result.returncode == 0, result.stderr
    assert dotenv(checkout) == {
        "GRAFANA_ADMIN_PASSWORD": "chosen-by-me",
        "GRAFANA_PORT": "3300",
        "COMPOSE_PROJECT_NAME": "trainstack",
    }
    assert "NVIDIA runtime: training on every GPU, service trainer" in result.stdout
    assert "compose --project-name trainstack --profile cpu up --detach --build trainer prometheus grafana" in calls
    assert "http://127.0.0.1:3300" in result.stdout


def test_up_passes_its_arguments_to_compose_up(checkout):
    result, calls = run_script(checkout, "compose-up.sh", "--no-build")
    assert result.returncode == 0, result.stderr
    assert (
        "compose --project-name trainstack --profile cpu up --detach --no-build trainer-cpu prometheus grafana" in calls
    )


def test_up_reports_a_trainer_that_exits_with_an_error(checkout):
    result, _ = run_script(checkout, "compose-up.sh", state="exited none 2")
    assert result.returncode == 1
    assert "trainer exited with code 2" in result.stderr and "trainer log line" in result.stderr
    assert "http://" not in result.stdout


def test_up_refuses_an_unknown_device_choice(checkout):
    result, _ = run_script(checkout, "compose-up.sh", TRAINSTACK_DEVICE="tpu")
    assert result.returncode == 2 and "TRAINSTACK_DEVICE must be gpu or cpu" in result.stderr


@pytest.mark.parametrize(
    "script, subcommand",
    [("compose-down.sh", "down"), ("compose-ps.sh", "ps"), ("compose-logs.sh", "logs --follow --tail 200")],
)
def test_down_ps_logs_cover_both_trainers_and_need_no_password(checkout, script, subcommand):
    result, calls = run_script(checkout, script)
    assert result.returncode == 0, result.stderr
    assert calls == ["compose version", f"compose --project-name trainstack --profile cpu {subcommand}"]
    assert not (checkout / ".env").exists()


def test_scripts_are_executable_and_parse():
    for script in (REPO / "scripts").glob("compose-*.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script.name
        if script.name != "compose-lib.sh":
            assert os.access(script, os.X_OK), f"{script.name} is not executable"
