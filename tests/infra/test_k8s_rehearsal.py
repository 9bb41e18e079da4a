"""A multi-node rehearsal: the rendered multi-node Job's pods 0 and 1 as two local processes.

Each process gets what Kubernetes would give that pod: the container's command and arguments, its environment
with the downward-API fields and $(VAR) references resolved, JOB_COMPLETION_INDEX from the Job controller, and its
volumes as folders (the checkpoint claim shared by both, as ReadWriteMany). Only what a laptop cannot have is
swapped: node 0's DNS name resolves to 127.0.0.1, ports are free ones, one CPU rank per node, a short run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.k8s import OVERLAYS_DIR, arg_value, expand, needs_kubectl, only, render
from tests.helpers.runs import REPO
from trainstack.rundir import LEASE_DIR, free_port

VENV_BIN = Path(sys.executable).parent
MAX_STEPS = 6
JOB_UID = "5b7e6f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"  # what the Job controller labels its pods with
# Variables a developer's shell may hold that would leak into the rehearsal's rendezvous.
DISTRIBUTED_ENV = re.compile(
    r"^(MASTER_ADDR|MASTER_PORT|NNODES|NODE_RANK|NPROC_PER_NODE|JOB_COMPLETION_INDEX|"
    r"RANK|LOCAL_RANK|WORLD_SIZE|GROUP_RANK|PET_.*|ACCELERATE_.*|PROMETHEUS_MULTIPROC_DIR)$"
)


def pod_environment(job: dict, container: dict, index: int) -> dict[str, str]:
    """The container's environment in pod <index> of the Indexed Job, as the kubelet builds it."""
    labels = {
        **job["spec"]["template"]["metadata"]["labels"],
        "batch.kubernetes.io/job-name": job["metadata"]["name"],
        "batch.kubernetes.io/controller-uid": JOB_UID,
    }
    env = {"JOB_COMPLETION_INDEX": str(index)}  # injected by the Job controller in Indexed mode
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = expand(variable["value"], env)
        else:
            field_path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", field_path)
            assert label, f"rehearsal cannot resolve fieldRef {field_path}"
            env[variable["name"]] = labels[label.group(1)]
    return env


@pytest.fixture(scope="module")
def multi_node_job() -> tuple[dict, dict, list[dict]]:
    docs = render(OVERLAYS_DIR / "multi-node")
    job = only(docs, "Job")
    container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    return job, container, docs


@pytest.mark.slow
@needs_kubectl
def test_every_pod_finds_node_0_at_its_stable_dns_name(multi_node_job):
    job, container, docs = multi_node_job
    service = only(docs, "Service")["metadata"]["name"]
    for index in range(job["spec"]["completions"]):
        env = pod_environment(job, container, index)
        assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{service}"
        assert env["NNODES"] == str(job["spec"]["completions"])


def pod_volumes(job: dict, container: dict, docs: list[dict], tmp_path: Path):
    """The pod's volumes as folders (the ConfigMap's files, one checkpoint claim every pod mounts); returns the
    function that maps a path in the container to its folder."""
    pod_spec = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    mounts = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            folder = tmp_path / "configmap"
            configmap = next(d for d in docs if d["metadata"]["name"] == volume["configMap"]["name"])
            folder.mkdir()
            for key, text in configmap["data"].items():
                (folder / key).write_text(text)
        elif "persistentVolumeClaim" in volume:
            folder = tmp_path / "claim"
            folder.mkdir()
        else:
            continue  # /dev/shm: the host's own
        mounts[mount["mountPath"]] = str(folder)

    def local_path(arg: str) -> str:
        for mount_path, folder in mounts.items():
            if arg == mount_path or arg.startswith(mount_path + "/"):
                return folder + arg[len(mount_path) :]
        return arg

    return local_path


def pod_command(container: dict, local_path) -> list[str]:
    """The container's command and arguments for a short local run: one CPU rank per pod, loopback only."""
    args = [local_path(a) for a in container["args"]]
    assert arg_value(args, "--exporter-host") == "0.0.0.0"
    args[args.index("--exporter-host") + 1] = "127.0.0.1"  # tests listen on loopback only
    args[args.index("--exporter-port") + 1] = str(free_port())
    args += [
        "--nproc-per-node",
        "1",
        "--max-steps",
        str(MAX_STEPS),
        "--model",
        "builtin:tiny-gpt",
        "--mixed-precision",
        "no",
        "--batch-size",
        "4",
        "--num-workers",
        "0",
        "--log-every",
        "2",
    ]
    return container["command"] + args


def pod_process_environment(job: dict, container: dict, index: int, master_port: str) -> dict[str, str]:
    env = pod_environment(job, container, index)
    env["MASTER_ADDR"] = "127.0.0.1"  # what <job>-0.<service> resolves to: pod 0's address
    env["MASTER_PORT"] = master_port
    environment = {k: v for k, v in os.environ.items() if not DISTRIBUTED_ENV.match(k)}
    environment.update(
        env,
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        OMP_NUM_THREADS="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    return environment


@needs_kubectl
@pytest.mark.slow
def test_multi_node_job_trains_as_one_world_across_two_pods(multi_node_job, tmp_path):
    job, container, docs = multi_node_job
    local_path = pod_volumes(job, container, docs, tmp_path)
    master_port = str(free_port())

    processes = {}
    for index in (1, 0):  # node 1 first: a pod may well start before node 0 exists
        environment = pod_process_environment(job, container, index, master_port)
        log = (tmp_path / f"pod-{index}.log").open("w")
        processes[index] = (
            subprocess.Popen(
                pod_command(container, local_path), env=environment, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
            ),
            log,
        )
    try:
        codes = {index: process.wait(timeout=480) for index, (process, _) in processes.items()}
    finally:
        for process, log in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    logs = {index: (tmp_path / f"pod-{index}.log").read_text() for index in processes}
    assert codes == {0: 0, 1: 0}, "\n".join(f"--- pod {i} ---\n{text[-3000:]}" for i, text in logs.items())

    run_dir = Path(local_path(arg_value(container["args"], "--output-dir")))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_reason"] == "completed"
    assert summary["world_size"] == 2
    assert summary["steps"] == MAX_STEPS
    # One rank per node: global rank r ran on node r. Each launcher reports rank 0's verdict only when rank 0
    # ran under it, so the "completed" line appears in pod 0's log alone.
    for rank in (0, 1):
        lines = [json.loads(line) for line in (run_dir / f"telemetry/rank-{rank}.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines if "time" in line][-1] == MAX_STEPS
    assert f"completed after {MAX_STEPS} steps" in logs[0]
    assert "completed after" not in logs[1]


# An old pod in its grace period: it holds the run directory's lease as the Job's node 0, and on SIGTERM spends a
# few seconds on its "checkpoint" before it exits and lets go.
OLD_POD = """
import signal, sys, time
from trainstack.supervisor.lease import RunDirLease
lease = RunDirLease(sys.argv[1], sys.argv[2], 0)
lease.acquire()
print("holding", flush=True)
signal.sigwait([signal.SIGTERM])
time.sleep(3)
lease.release()
"""


@needs_kubectl
@pytest.mark.slow
def test_a_replacement_pod_waits_for_the_old_pod_to_let_go_then_trains(tmp_path):
    docs = render(OVERLAYS_DIR / "single-node")
    job = only(docs, "Job")
    container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    local_path = pod_volumes(job, container, docs, tmp_path)
    run_dir = Path(local_path(arg_value(container["args"], "--output-dir")))
    environment = pod_process_environment(job, container, 0, str(free_port()))
    assert environment["TRAINSTACK_RUN_ID"] == JOB_UID

    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # inherited: the old pod takes it with sigwait
    try:
        old = subprocess.Popen(
            [sys.executable, "-c", OLD_POD, str(run_dir), JOB_UID],
            env=environment,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    log_path, new = tmp_path / "new-pod.log", None
    with log_path.open("w") as log:
        try:
            assert old.stdout.readline().strip() == "holding"
            new = subprocess.Popen(
                pod_command(container, local_path), env=environment, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + 120
            while "waiting up to 900 s" not in log_path.read_text():
                assert new.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
            assert sorted(p.name for p in run_dir.rglob("*")) == [LEASE_DIR, "node-0.json"]  # nothing written
            old.send_signal(signal.SIGTERM)  # the old pod finishes its grace period and exits
            assert old.wait(timeout=60) == 0
            code = new.wait(timeout=480)
        finally:
            for process in (old, new):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
    text = log_path.read_text()
    assert code == 0, text[-3000:]
    assert text.count("waiting up to 900 s") == 1 and f"(run {JOB_UID}, node 0)" in text
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == MAX_STEPS
    assert not (run_dir / LEASE_DIR).exists()
