"""trainstack/promcompat.py: prometheus_client's internals in one place, refused in one line for any version but
the one they were read from. (That they still merge and encode exactly as the library does:
tests/test_exporter_serving.py and tests/test_exporter_exposition.py.)"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainstack import promcompat
from trainstack.errors import EXIT_CONFIG, ConfigError

REAL_VERSION = importlib.metadata.version


def test_it_was_written_for_the_pinned_version():
    pinned = next(line for line in (REPO / "requirements.lock").read_text().splitlines()
                  if line.startswith("prometheus_client=="))
    assert f"=={promcompat.WRITTEN_FOR}" in pinned and promcompat.installed == promcompat.WRITTEN_FOR


def test_another_version_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.27.0" if name == "prometheus-client" else REAL_VERSION(name))
    try:
        with pytest.raises(ConfigError) as refused:
            importlib.reload(promcompat)
    finally:
        monkeypatch.undo()
        importlib.reload(promcompat)  # the real version again, for the tests after this one
    message = str(refused.value)
    assert "\n" not in message
    assert "prometheus-client 0.27.0 is installed" in message and "prometheus-client==0.26.0" in message
    assert promcompat.installed == "0.26.0"


@pytest.mark.slow
def test_the_exporter_stops_on_another_version_with_one_line_and_exit_2():
    script = ("import importlib.metadata as m, sys\n"
              "real = m.version\n"
              "m.version = lambda name: '0.25.1' if name == 'prometheus-client' else real(name)\n"
              "from trainstack.monitoring.exporter.cli import main\n"
              "sys.exit(main(['--port', '0']))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert result.stderr.startswith("trainstack exporter: error: prometheus-client 0.25.1 is installed")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("name, parts", [
    ("counter_1234.db", ("counter", "", "1234")),
    ("histogram_77.db", ("histogram", "", "77")),
    ("gauge_mostrecent_1234.db", ("gauge", "mostrecent", "1234")),
    ("gauge_livemostrecent_9.db", ("gauge", "livemostrecent", "9")),
])
def test_multiprocess_file_names(name, parts):
    assert promcompat.db_file_parts(name) == parts


def test_nothing_else_touches_prometheus_client_internals():
    """Only the public API outside promcompat: the internals' modules and names are imported nowhere else."""
    internal = ("prometheus_client.mmap_dict", "MmapedDict", "_accumulate_metrics", "_multiprocess_mode",
                "prometheus_client.openmetrics", "prometheus_client.utils", "prometheus_client.exposition")
    offenders = [f"{path.relative_to(REPO)}: {word}"
                 for package in ("train", "monitoring", "bench", "trainstack")
                 for path in sorted((REPO / package).rglob("*.py")) if path.name != "promcompat.py"
                 for word in internal if word in path.read_text()]
    assert offenders == []
