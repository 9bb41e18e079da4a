"""compose.yaml, read statically: the compose-spec schema, docker-compose 1.29 and Compose v2 accept it, and the
settings a GPU training stack needs are there (shared memory, ulimits, GPUs, loopback ports, no default password,
health-gated start, the monitoring configuration it mounts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.compose import GiB, size_bytes
from tests.helpers.runs import REPO

COMPOSE_FILE = REPO / "compose.yaml"
TRAINERS = ("trainer", "trainer-cpu")


def resolved() -> dict:
    """compose.yaml as a fresh checkout sees it: `${VAR:-default}` resolved to its default."""
    return yaml.safe_load(re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", COMPOSE_FILE.read_text()))


def services() -> dict:
    return resolved()["services"]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize("name", TRAINERS)
def test_trainer_has_shared_memory_ulimits_volume_and_a_grace_period(name):
    trainer = services()[name]
    assert size_bytes(trainer["shm_size"]) >= GiB, "Docker's 64 MB /dev/shm breaks loader workers and NCCL"
    assert trainer["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert any(volume.split(":")[1] == "/workspace/runs" for volume in trainer["volumes"])
    minutes = re.fullmatch(r"(\d+)m", trainer["stop_grace_period"])
    assert minutes and int(minutes[1]) >= 2, "SIGKILL must not arrive before a checkpoint is written"
    command = trainer["command"]
    assert flag(command, "--exporter-host") == "0.0.0.0", "Prometheus reaches the exporter from another container"
    assert [port.rsplit(":", 1)[1] for port in trainer["ports"]] == [flag(command, "--exporter-port")]
    assert "/healthz" in " ".join(trainer["healthcheck"]["test"])


def test_gpu_trainer_reserves_every_gpu_and_the_cpu_variant_none():
    trainer, cpu = services()["trainer"], services()["trainer-cpu"]
    assert trainer["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert "profiles" not in trainer, "plain `docker compose up` on a GPU host must start the GPU trainer"
    assert "deploy" not in cpu and cpu["profiles"] == ["cpu"]
    assert "--cpu" in cpu["command"] and flag(cpu["command"], "--nproc-per-node") == "2"


def test_every_published_port_binds_loopback():
    for name, service in services().items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"


def test_grafana_password_has_no_default_and_grafana_waits_for_prometheus():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["grafana"]
    password = raw["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", password), "the password must be required"
    assert raw["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for name, service in services().items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_third_party_images_are_pinned():
    for name in ("prometheus", "grafana"):
        image = services()[name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{name}: {image} is not a pinned version"


def test_monitoring_configuration_is_mounted_and_prometheus_targets_the_trainer():
    config = services()
    for name in ("prometheus", "grafana"):
        for volume in config[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).is_dir(), f"{name} mounts {source}, which does not exist"
    home = config["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    dashboards = next(v.split(":") for v in config["grafana"]["volumes"] if v.startswith("./monitoring/grafana/dash"))
    assert (REPO / dashboards[0] / Path(home).relative_to(dashboards[1])).is_file()
    reachable = {"trainer"} | set(config["trainer-cpu"]["networks"]["default"]["aliases"])
    for targets_file in (REPO / "monitoring" / "prometheus" / "targets").glob("*.yml"):
        for group in yaml.safe_load(targets_file.read_text()):
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                assert host in reachable and port == "9450", f"{targets_file.name}: {target} is not the trainer"
