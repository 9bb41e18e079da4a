"""The real image on a real Docker engine: docker/Dockerfile, built with only the base image and the wheelhouse
substituted, runs the `trainer-cpu` service's command (2 CPU ranks), serves metrics, stops with a checkpoint on
`docker stop` and resumes from it.

No registry is reachable here, so the base is Debian bookworm from `mmdebstrap` (through the Debian mirror apt
uses) turned into an image with `docker import`, and the Python packages come from a wheelhouse made on this
machine by docker/wheelhouse.sh (PyTorch's CPU wheel as pip's configuration finds it). Both are cached under
TRAINSTACK_TEST_CACHE (default /var/cache/trainstack-test), so only the first run pays for them. When no Docker
daemon answers and this process is root, the test starts its own `dockerd` (data root in the cache, so image
layers are cached too; bridge and iptables off) and stops it afterwards. Containers use the host network.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.compose import size_bytes
from tests.helpers.runs import REPO, stop_process
from trainstack.rundir import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CACHE = Path(os.environ.get("TRAINSTACK_TEST_CACHE", "/var/cache/trainstack-test"))
SUITE = "bookworm"
SUITE_PYTHON, SUITE_GLIBC = "3.11", "2.36"  # bookworm's: the wheelhouse is downloaded for them
BASE_PACKAGES = ("python3", "python3-venv", "tini")  # what docker/install-os-packages.sh would otherwise apt-get
TEST_IMAGE = "trainstack-test/trainer:latest"
BUILDER_IMAGE = "trainstack-test/builder:latest"
SERVICE = "trainer-cpu"
PID_FILE = CACHE / "dockerd.pid"
BUILD_CACHE_KEPT = "8gb"  # BuildKit's cache of one build: the wheelhouse in the context, the venv, the layers
MERGED_USR_HOOK = Path("/usr/share/mmdebstrap/hooks/merged-usr")


@dataclass
class Engine:
    env: dict[str, str]
    own_daemon: bool  # started by this test: its images are the test's to prune
    buildkit_cli: str | None = None  # a docker CLI that builds with BuildKit (`buildkit_cli`); None: the legacy builder

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return self._run(["docker", *args], self.env, timeout, check)

    def build(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        """`docker build` with BuildKit where a CLI here has it, else with the legacy builder."""
        if self.buildkit_cli is None:
            return self._run(["docker", "build", *args], {**self.env, "DOCKER_BUILDKIT": "0"}, timeout, True)
        command = [self.buildkit_cli, "build", "--progress", "plain", *args]
        return self._run(command, {**self.env, "DOCKER_BUILDKIT": "1"}, timeout, True)

    @staticmethod
    def _run(command: list[str], env: dict[str, str], timeout: float, check: bool) -> subprocess.CompletedProcess:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            shown = " ".join([Path(command[0]).name, *command[1:4]])
            pytest.fail(f"{shown} ... exited {result.returncode}:\n{result.stderr[-6000:]}")
        return result


def buildkit_cli(env: dict[str, str]) -> str | None:
    """The first docker CLI on PATH that builds with BuildKit, as Docker 23 and newer build by default: one with the
    buildx plugin, or one older than 23 with BuildKit's client built in (Debian bookworm's docker.io 20.10). A cold
    build of the image takes 83 CPU-s with it against 142 with the legacy builder, which commits each step's whole
    file system and copies the 1.3 GB venv between stages file by file (docs/benchmarks.md, "Test suite time")."""
    seen = set()
    for folder in env.get("PATH", "").split(os.pathsep):
        cli = Path(folder or ".", "docker")
        if not (cli.is_file() and os.access(cli, os.X_OK)) or cli.resolve() in seen:
            continue
        seen.add(cli.resolve())
        if subprocess.run([cli, "buildx", "version"], env=env, capture_output=True).returncode == 0:
            return str(cli)
        # Prints the client's version even where no daemon answers (and then exits 1).
        version = subprocess.run(
            [cli, "version", "--format", "{{.Client.Version}}"], env=env, capture_output=True, text=True
        ).stdout
        if (major := re.match(r"\s*(\d+)\.", version)) and int(major.group(1)) < 23:
            return str(cli)
    return None


def writable_cache() -> Path:
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        pytest.skip(f"cannot use the cache {CACHE} ({error.strerror}); set TRAINSTACK_TEST_CACHE to a writable folder")
    if not os.access(CACHE, os.W_OK):
        pytest.skip(f"the cache {CACHE} is not writable; set TRAINSTACK_TEST_CACHE to a writable folder")
    return CACHE


def _answers(env: dict[str, str]) -> bool:
    try:
        probe = subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def remove_exec_root(exec_root: Path) -> None:
    """dockerd leaves its network namespace file bind-mounted under the exec root: unmount, then delete."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{exec_root}/")), reverse=True):
        subprocess.run(["umount", mount], capture_output=True)
    shutil.rmtree(exec_root, ignore_errors=True)


def _leftover_dockerd() -> int | None:
    """The test dockerd of a run that was killed before its teardown, if it is still alive."""
    try:
        pid = int(PID_FILE.read_text())
        alive = b"dockerd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if alive else None


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (Debian: apt-get install docker.io, or make system-deps)")
    env = dict(os.environ)
    if _answers(env):
        yield Engine(env, own_daemon=False, buildkit_cli=buildkit_cli(env))
        return
    if os.geteuid() != 0:
        pytest.skip("no Docker daemon answers, and starting dockerd needs root")
    if shutil.which("dockerd") is None:
        pytest.skip("no Docker daemon answers and no dockerd to start (Debian: apt-get install docker.io)")
    writable_cache()
    # One test dockerd per data root: a concurrent session waits here rather than corrupting it.
    lock = (CACHE / "dockerd.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    leftover = _leftover_dockerd()
    if leftover:
        lock.close()
        pytest.skip(
            f"dockerd pid {leftover}, left by an interrupted test run, still uses {CACHE / 'docker'}; "
            f"stop it (kill {leftover}) and rerun"
        )
    # Short paths: containerd's sockets live under the exec root and unix socket paths are limited to 108 bytes.
    exec_root = Path(tempfile.mkdtemp(prefix="tsdocker-", dir="/tmp"))
    socket_path = exec_root / "docker.sock"
    log_path = exec_root / "dockerd.log"
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(CACHE / "docker"),
                "--exec-root",
                str(exec_root),
                "--pidfile",
                str(exec_root / "docker.pid"),
                "--host",
                f"unix://{socket_path}",
                "--bridge",
                "none",
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    PID_FILE.write_text(str(daemon.pid))
    env["DOCKER_HOST"] = f"unix://{socket_path}"
    try:
        deadline = time.monotonic() + 90
        while not _answers(env):
            if daemon.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                pytest.skip("dockerd could not start here: " + " | ".join(tail))
            time.sleep(1)
        yield Engine(env, own_daemon=True, buildkit_cli=buildkit_cli(env))
    finally:
        stop_process(daemon)
        PID_FILE.unlink(missing_ok=True)
        remove_exec_root(exec_root)
        lock.close()


def debian_mirror() -> str:
    """The Debian mirror apt is configured with (one-line or deb822 sources), else deb.debian.org."""
    if os.environ.get("TRAINSTACK_TEST_DEBIAN_MIRROR"):
        return os.environ["TRAINSTACK_TEST_DEBIAN_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if path.suffix not in (".list", ".sources", "") or not path.is_file():
            continue
        for uri in re.findall(r"^(?:deb\s+(?:\[[^]]*\]\s+)?|URIs:\s*)(\S+)", path.read_text(), re.MULTILINE):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def base_image(engine: Engine) -> str:
    """Debian bookworm (minbase + Python + tini) from mmdebstrap, imported once and cached as a tarball."""
    key = _key(SUITE, "minbase", BASE_PACKAGES)
    tag = f"trainstack-test/base:{SUITE}-{key}"
    if engine.docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    tarball = CACHE / f"base-{SUITE}-{key}.tar"
    if not tarball.is_file():
        if os.geteuid() != 0 or shutil.which("mmdebstrap") is None or not MERGED_USR_HOOK.is_dir():
            pytest.skip("building the Debian base image needs root and mmdebstrap (apt-get install mmdebstrap)")
        mirror = debian_mirror()
        try:
            urllib.request.urlopen(f"{mirror}/dists/{SUITE}/Release", timeout=20).close()
        except (urllib.error.URLError, OSError) as error:
            pytest.skip(f"Debian mirror {mirror} unreachable ({error}); set TRAINSTACK_TEST_DEBIAN_MIRROR")
        with tempfile.TemporaryDirectory(dir=writable_cache()) as scratch:
            partial = Path(scratch) / "base.tar"
            # mmdebstrap rather than debootstrap: apt fetches the packages in parallel and the tarball is written
            # as the root file system is made, 16 s against 44 s (docs/benchmarks.md, "Test suite time"). Its
            # merged-/usr hook installs usr-is-merged, as debootstrap does, where apt alone would pick usrmerge and
            # with it perl.
            result = subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--include=" + ",".join(BASE_PACKAGES),
                    f"--hook-dir={MERGED_USR_HOOK}",
                    SUITE,
                    str(partial),
                    mirror,
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert result.returncode == 0, f"mmdebstrap failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            partial.rename(tarball)
    engine.docker("import", str(tarball), tag, timeout=600)
    return tag


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """Every wheel the image installs, for bookworm's Python, made once per lock file by docker/wheelhouse.sh."""
    script = REPO / "docker" / "wheelhouse.sh"
    build_requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = (REPO / "requirements.lock").read_bytes()
    key = _key(SUITE_PYTHON, SUITE_GLIBC, lock, build_requires, script.read_bytes())
    folder = CACHE / f"wheelhouse-py{SUITE_PYTHON}-{key}"
    if not folder.is_dir():
        with tempfile.TemporaryDirectory(prefix="partial-wheelhouse-", dir=writable_cache()) as scratch:
            result = subprocess.run(
                ["bash", str(script), f"{scratch}/wheels", SUITE_PYTHON, SUITE_GLIBC],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert result.returncode == 0, f"docker/wheelhouse.sh failed:\n{result.stderr[-4000:]}"
            Path(scratch, "wheels").rename(folder)
        for outdated in CACHE.glob(f"wheelhouse-py{SUITE_PYTHON}-*"):
            if outdated != folder:
                shutil.rmtree(outdated, ignore_errors=True)
    return folder


def compose_service(name: str) -> dict:
    """A service of compose.yaml with `${VAR:-default}` resolved to its default, as a fresh checkout sees it."""
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", (REPO / "compose.yaml").read_text())
    return yaml.safe_load(text)["services"][name]


def build_context(destination: Path, wheels: Path) -> None:
    """The checkout as `docker build .` would send it (files git tracks or would track), plus the wheelhouse."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    shutil.copytree(wheels, destination / "wheelhouse", copy_function=os.link)


@pytest.fixture(scope="module")
def image(engine: Engine, base_image: str, wheelhouse: Path, tmp_path_factory) -> str:
    service = compose_service(SERVICE)
    build = service["build"]
    args = {**build.get("args", {}), "BASE_IMAGE": base_image, "WHEELHOUSE": "wheelhouse"}
    context = tmp_path_factory.mktemp("context")
    build_context(context, wheelhouse)
    command = ["--network", "host", "--file", str(context / build["dockerfile"])]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    if engine.buildkit_cli is None:
        # The legacy builder keeps a stage's layers only while an image holds them: the build stage gets a tag of
        # its own, so that pruning the previous images keeps them (PyTorch and the other pinned packages) for the
        # next run. BuildKit keeps its cache apart from the images.
        engine.build(
            *command, "--target", "builder", "--tag", BUILDER_IMAGE, str(context / build["context"]), timeout=1500
        )
    engine.build(*command, "--tag", TEST_IMAGE, str(context / build["context"]), timeout=1500)
    if engine.own_daemon:
        engine.docker("image", "prune", "--force", timeout=600)
        if engine.buildkit_cli is not None:  # the layers of older lock files' builds, least recently used first
            engine.docker("builder", "prune", "--force", "--keep-storage", BUILD_CACHE_KEPT, timeout=600)
    return TEST_IMAGE


def settable_limit(name: str, value: int) -> int:
    """value, or this host's hard limit where the daemon cannot raise it that far (no CAP_SYS_RESOURCE: some
    sandboxes and rootless Docker); the container then runs with the most this host allows."""
    resource_id = getattr(resource, f"RLIMIT_{name.upper()}")
    wanted = resource.RLIM_INFINITY if value == -1 else value
    raise_it = f"import resource; resource.setrlimit({resource_id}, ({wanted}, {wanted}))"
    if subprocess.run([sys.executable, "-c", raise_it], capture_output=True).returncode == 0:
        return value
    hard = resource.getrlimit(resource_id)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard


def container_options(service: dict, run_dir: Path) -> list[str]:
    """docker run options for the service's shared memory and ulimits; the runs volume becomes run_dir."""
    options = [
        "--network",
        "host",
        "--shm-size",
        service["shm_size"],
        "--env",
        "TQDM_DISABLE=1",
        "--volume",
        f"{run_dir}:/workspace/runs",
    ]
    for name, value in service["ulimits"].items():
        limit = settable_limit(name, value)
        options += ["--ulimit", f"{name}={limit}:{limit}"]
    return options


def trainer_command(service: dict, exporter_port: int, *overrides: str) -> list[str]:
    """The service's command, with the exporter on this host's loopback (host network) and test-sized steps."""
    command = list(service["command"])
    command[command.index("--exporter-host") + 1] = "127.0.0.1"
    command[command.index("--exporter-port") + 1] = str(exporter_port)
    return [*command, "--batch-size", "8", "--num-workers", "1", "--log-every", "5", *overrides]


def steps_by_rank(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    return {
        rank: float(value)
        for rank, value in re.findall(r'^trainstack_train_steps_total\{rank="(\d+)"\} (\S+)$', text, re.M)
    }


def test_image_is_offline_by_default(engine: Engine, image: str):
    config = json.loads(engine.docker("image", "inspect", image).stdout)[0]["Config"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"


def inside(engine: Engine, name: str, code: str) -> str:
    return engine.docker("exec", name, "python", "-c", code).stdout.strip()


def test_trainer_serves_metrics_checkpoints_on_docker_stop_and_resumes(engine: Engine, image: str, tmp_path):
    service = compose_service(SERVICE)
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    uid = int(json.loads(engine.docker("image", "inspect", image).stdout)[0]["Config"]["User"])
    assert uid != 0, "the image runs as root"
    os.chown(run_dir, uid, uid)
    port = free_port()
    name = f"trainstack-test-{os.getpid()}-{port}"
    options = container_options(service, run_dir)
    # A run far longer than the test: it only ends when `docker stop` ends it.
    engine.docker(
        "run",
        "--detach",
        "--name",
        name,
        *options,
        image,
        *trainer_command(service, port, "--max-steps", "100000", "--checkpoint-every", "0"),
    )
    try:
        deadline = time.monotonic() + 300
        steps: dict[str, float] = {}
        while set(steps) != {"0", "1"} or min(steps.values()) < 10:
            state = json.loads(engine.docker("inspect", name).stdout)[0]["State"]
            assert state["Running"], (
                f"trainer exited {state['ExitCode']}:\n" + engine.docker("logs", name, check=False).stderr[-4000:]
            )
            assert time.monotonic() < deadline, "the exporter never showed 10 steps on both ranks"
            time.sleep(1)
            steps = steps_by_rank(port)
        # The running container: tini as PID 1 (signals, reaping), a non-root user, the service's /dev/shm and stack.
        assert inside(engine, name, "print(open('/proc/1/comm').read())") == "tini"
        assert inside(engine, name, "import os; print(os.getuid())") == str(uid) != "0"
        shm = inside(engine, name, "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)")
        assert int(shm) == size_bytes(service["shm_size"])
        stack = inside(engine, name, "import resource; print(resource.getrlimit(resource.RLIMIT_STACK)[0])")
        assert int(stack) == service["ulimits"]["stack"]
        engine.docker("stop", "--time", "240", name, timeout=300)
        state = json.loads(engine.docker("inspect", name).stdout)[0]["State"]
        logs = engine.docker("logs", name, check=False)
    finally:
        engine.docker("rm", "--force", name, check=False)
    output = run_dir / service["command"][service["command"].index("--output-dir") + 1].removeprefix("/workspace/runs/")
    stopped = json.loads((output / "summary.json").read_text())
    assert state["ExitCode"] == 75, f"exit {state['ExitCode']}:\n{logs.stderr[-4000:]}"
    assert stopped["exit_reason"] == "preempted" and stopped["world_size"] == 2
    assert stopped["distributed_type"] == "MULTI_CPU"
    saved = output / "checkpoints" / f"step-{stopped['steps']:08d}"
    assert (saved / "trainstack.json").is_file(), sorted(p.name for p in (output / "checkpoints").iterdir())

    # The same command again (with a reachable end) picks the checkpoint up.
    resumed = engine.docker(
        "run",
        "--rm",
        *options,
        image,
        *trainer_command(service, port, "--max-steps", str(stopped["steps"] + 10), "--checkpoint-every", "0"),
        timeout=600,
        check=False,
    )
    finished = json.loads((output / "summary.json").read_text())
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert finished["resumed_from"].endswith(saved.name)
    assert finished["exit_reason"] == "completed" and finished["steps"] == stopped["steps"] + 10
