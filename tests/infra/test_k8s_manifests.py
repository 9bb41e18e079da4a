"""k8s/: every overlay builds, passes schema validation, and keeps the settings a GPU training pod needs.

Rendering uses `kubectl kustomize`; core kinds are checked with kubernetes-validate's strict schemas, custom
resources with the openAPIV3Schema of their CRDs in ../shared/crds (beside the checkout).
"""

from __future__ import annotations

import copy
import os
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from tests.helpers.k8s import KUBECTL, NO_KUBECTL, OVERLAYS_DIR, SAFE_LOADER, arg_value, needs_kubectl, only, render
from tests.helpers.runs import REPO as ROOT
from trainstack.rundir import DEFAULT_LEASE_TIMEOUT_SECONDS, RUN_ID_ENV
from trainstack.train.rank.config import TrainConfig, read_config_file

pytestmark = pytest.mark.slow

OVERLAYS = sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").is_file())
JOB_OVERLAYS = ("single-node", "multi-node")
SHARED_STORAGE_OVERLAYS = ("multi-node", "kubeflow-trainer")
CRDS_DIR = ROOT.parent / "shared/crds"
# The oldest Kubernetes the manifests support (podFailurePolicy is GA from 1.31) and the newest schemas at hand.
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
CUSTOM_GROUPS = ("monitoring.coreos.com", "trainer.kubeflow.org")
EXIT_CONFIG, EXIT_FAILED, EXIT_PREEMPTED = 2, 1, 75
# Time for the ranks to reach the next log interval after SIGTERM and write a checkpoint.
MIN_GRACE_SECONDS = 300
# Host memory a rank and its loader workers need beside /dev/shm, per GPU.
MIN_MEMORY_PER_GPU = 8 * 2**30


def quantity(value: str | int) -> float:
    """A Kubernetes quantity in base units: '32Gi' -> 34359738368, '500m' -> 0.5."""
    number, suffix = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value)).groups()
    binary = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    decimal = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(number) * (binary.get(suffix) or decimal[suffix])


def env_value(container: dict, name: str) -> str:
    return next(e["value"] for e in container.get("env", []) if e["name"] == name)


def trainer_pod(docs: list[dict]) -> tuple[dict, dict]:
    """(pod template, trainer container) as the cluster will run them, from a Job or a TrainJob's patches."""
    job = [d for d in docs if d["kind"] == "Job"]
    if job:
        pod = job[0]["spec"]["template"]
        return pod, next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    trainjob = only(docs, "TrainJob")
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = copy.deepcopy(patch["template"]["spec"]["template"])
    container = pod["spec"]["containers"][0]
    trainer = trainjob["spec"]["trainer"]
    container.update(
        image=trainer["image"],
        command=trainer["command"],
        args=trainer["args"],
        resources=trainer["resourcesPerNode"],
        env=trainer.get("env", []),
    )
    return pod, container


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    if KUBECTL is None:
        pytest.skip(NO_KUBECTL)
    return {name: render(OVERLAYS_DIR / name) for name in OVERLAYS}


def test_the_three_overlays_exist():
    assert set(OVERLAYS) == {"single-node", "multi-node", "kubeflow-trainer"}


@needs_kubectl
def test_base_builds_on_its_own():
    kinds = {d["kind"] for d in render(ROOT / "k8s/base")}
    assert {"Job", "Service", "PersistentVolumeClaim", "ConfigMap", "PodMonitor", "PrometheusRule"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_workload_and_its_monitoring(rendered, overlay):
    kinds = [d["kind"] for d in rendered[overlay]]
    workload = {"Job", "Service"} if overlay in JOB_OVERLAYS else {"TrainJob"}
    assert workload <= set(kinds)
    assert not ({"Job", "Service", "TrainJob"} - workload) & set(kinds), "two controllers for the same training"
    assert {"PersistentVolumeClaim", "PodMonitor", "PrometheusRule"} <= set(kinds)
    assert kinds.count("ConfigMap") >= 1


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_pass_strict_schema_validation(rendered, overlay, version):
    core = [d for d in rendered[overlay] if d["apiVersion"].split("/")[0] not in CUSTOM_GROUPS]
    assert core
    for document in core:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{document['kind']}/{document['metadata']['name']} {path}: {error.message}")
        except SchemaNotFoundError as error:
            pytest.fail(error.message)


@needs_kubectl
def test_strict_validation_rejects_an_unknown_field(rendered):
    job = copy.deepcopy(only(rendered["single-node"], "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["shmSize"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)


def _strict(schema: dict) -> dict:
    """A CRD schema that refuses unknown fields, as the API server's strict field validation does (it would
    otherwise prune them silently)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_schemas() -> dict[tuple[str, str], dict]:
    if not CRDS_DIR.is_dir():
        pytest.skip(
            f"{CRDS_DIR} is absent (the CRD schemas live beside the project's checkout, in ../shared/crds): "
            "custom resources not validated"
        )
    schemas = {}
    for path in CRDS_DIR.glob("*.yaml"):
        crd = yaml.load(path.read_text(), Loader=SAFE_LOADER)
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[api_version, crd["spec"]["names"]["kind"]] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def _crd_errors(document: dict, crd_schemas: dict) -> list[str]:
    key = (document["apiVersion"], document["kind"])
    assert key in crd_schemas, f"no CRD in {CRDS_DIR} for {key}"
    validator = jsonschema.Draft7Validator(crd_schemas[key])
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_match_their_crds(rendered, crd_schemas, overlay):
    custom = [d for d in rendered[overlay] if d["apiVersion"].split("/")[0] in CUSTOM_GROUPS]
    assert custom
    for document in custom:
        errors = _crd_errors(document, crd_schemas)
        assert not errors, f"{document['kind']}/{document['metadata']['name']}: {errors}"


def test_crd_validation_rejects_an_unknown_field(rendered, crd_schemas):
    podmonitor = copy.deepcopy(only(rendered["single-node"], "PodMonitor"))
    podmonitor["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "15s"
    assert _crd_errors(podmonitor, crd_schemas)


# Policy: what every trainer pod needs, whichever overlay made it.


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dev_shm_is_a_sized_memory_volume_covered_by_the_memory_limit(rendered, overlay):
    pod, container = trainer_pod(rendered[overlay])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    shm = quantity(volume["emptyDir"]["sizeLimit"])
    assert shm >= 2**30
    # tmpfs pages count against the container's memory: the limit must hold /dev/shm plus the ranks themselves.
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    gpus = int(limits["nvidia.com/gpu"])
    assert quantity(limits["memory"]) - shm >= MIN_MEMORY_PER_GPU * gpus
    assert quantity(requests["memory"]) == quantity(limits["memory"]), "memory overcommit gets ranks OOM-killed"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpus_are_requested_and_their_taint_tolerated(rendered, overlay):
    pod, container = trainer_pod(rendered[overlay])
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert any(
        t["key"] == "nvidia.com/gpu"
        and t.get("effect") == "NoSchedule"
        and (t.get("operator") == "Exists" or "value" in t)
        for t in pod["spec"]["tolerations"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context_is_restricted(rendered, overlay):
    pod, container = trainer_pod(rendered[overlay])
    pod_context, context = pod["spec"]["securityContext"], container["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert pod_context["runAsUser"] != 0
    assert pod_context["seccompProfile"]["type"] == "RuntimeDefault"
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "add" not in context["capabilities"]
    assert not context.get("privileged"), "GPUs come from the device plugin, never from privileged mode"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_leaves_time_for_the_sigterm_checkpoint(rendered, overlay):
    pod, _ = trainer_pod(rendered[overlay])
    assert pod["spec"]["terminationGracePeriodSeconds"] >= MIN_GRACE_SECONDS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_trainer_runs_trainstack_with_its_config_and_checkpoints_on_the_volumes(rendered, overlay):
    docs = rendered[overlay]
    pod, container = trainer_pod(docs)
    assert container["command"][-2:] == ["trainstack", "train"]
    args = container["args"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}

    def volume_holding(path: str) -> tuple[dict, str]:
        mount_path = max((m for m in mounts if path.startswith(m.rstrip("/") + "/")), key=len)
        return volumes[mounts[mount_path]], path[len(mount_path) :].lstrip("/")

    volume, key = volume_holding(arg_value(args, "--config"))
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    config = yaml.safe_load(configmaps[volume["configMap"]["name"]]["data"][key])
    volume, _ = volume_holding(arg_value(args, "--output-dir"))
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    claim = claims[volume["persistentVolumeClaim"]["claimName"]]
    if overlay in SHARED_STORAGE_OVERLAYS:
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every node writes its part of a checkpoint"
    resume = arg_value(args, "--resume") if "--resume" in args else config.get("resume", TrainConfig().resume)
    assert resume == "auto", "a replacement pod must resume"
    assert arg_value(args, "--exporter-host") == "0.0.0.0", "Prometheus scrapes the pod IP, not loopback"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_replacement_pod_waits_for_the_pod_holding_the_run_directory(rendered, overlay):
    pod, container = trainer_pod(rendered[overlay])
    wait = float(arg_value(container["args"], "--wait-for-lease"))
    # An old pod SIGKILLed at the end of its grace period is taken over once its heartbeat is a timeout old.
    assert wait >= pod["spec"]["terminationGracePeriodSeconds"] + DEFAULT_LEASE_TIMEOUT_SECONDS
    run_id = next(e for e in container["env"] if e["name"] == RUN_ID_ENV)
    # The Job's uid: one run for all its nodes and their replacements, another run for another Job.
    assert run_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/controller-uid']"
    # The exporter answers only once the lease is held: a liveness probe would kill the waiting pod unless a startup
    # probe holds it off for the whole wait. The Job's pods are probed; the TrainJob's runtime patch sets no probes.
    assert ("livenessProbe" in container) == (overlay in JOB_OVERLAYS), overlay
    if overlay in JOB_OVERLAYS:
        probe = container["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= wait + 120


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_training_config_is_valid_for_the_trainer(rendered, overlay, tmp_path):
    configmaps = [d for d in rendered[overlay] if d["metadata"]["name"].startswith("trainstack-config")]
    assert configmaps
    for configmap in configmaps:
        path = tmp_path / "config.yaml"
        path.write_text(configmap["data"]["config.yaml"])
        TrainConfig(**read_config_file(str(path)))


@pytest.mark.parametrize("overlay", JOB_OVERLAYS)
def test_failure_policy_fails_fast_on_config_errors_and_retries_only_real_failures(rendered, overlay):
    spec = only(rendered[overlay], "Job")["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # Counted per node, and the first node out of retries ends the Job.
    assert spec["backoffLimitPerIndex"] >= 1
    assert spec["maxFailedIndexes"] == 0
    assert spec["podReplacementPolicy"] == "Failed", "a replacement must not start before the checkpoint is written"

    def action_for_exit(code: int) -> str:
        """The action of the first rule matching a trainer exit code; "Count" when none does."""
        for rule in spec["podFailurePolicy"]["rules"]:
            on = rule.get("onExitCodes")
            if on and on["containerName"] == "trainer" and (code in on["values"]) == (on["operator"] == "In"):
                return rule["action"]
        return "Count"

    assert action_for_exit(EXIT_CONFIG) == "FailJob"
    assert action_for_exit(EXIT_PREEMPTED) == "Ignore"  # a checkpoint was saved: the rerun resumes
    assert action_for_exit(EXIT_FAILED) == "Count"
    disruption = {"type": "DisruptionTarget", "status": "True"}
    assert any(
        r["action"] == "Ignore" and disruption in r.get("onPodConditions", [])
        for r in spec["podFailurePolicy"]["rules"]
    )


@pytest.mark.parametrize("overlay", JOB_OVERLAYS)
def test_probes_hit_the_exporter_health_endpoint(rendered, overlay):
    _, container = trainer_pod(rendered[overlay])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    exporter_port = int(arg_value(container["args"], "--exporter-port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check["path"] == "/healthz"
        assert ports.get(check["port"], check["port"]) == exporter_port


@pytest.mark.parametrize("overlay", JOB_OVERLAYS)
def test_indexed_job_gives_one_pod_per_node_and_a_stable_rendezvous_name(rendered, overlay):
    docs = rendered[overlay]
    job, service = only(docs, "Job"), only(docs, "Service")
    spec, pod_spec = job["spec"], job["spec"]["template"]["spec"]
    container = next(c for c in pod_spec["containers"] if c["name"] == "trainer")
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env_value(container, "NNODES"))
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True, "pod 0 must resolve before it is ready"
    assert pod_spec["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"]
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    # Kubernetes names pod <index> of an Indexed Job <job>-<index>: node 0 is <job>-0.<service>.
    job_name_env = next(e for e in container["env"] if e["name"] == "JOB_NAME")
    assert job_name_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/job-name']"
    assert env_value(container, "MASTER_ADDR") == "$(JOB_NAME)-0.$(JOB_NAME)"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(env_value(container, "MASTER_PORT")) == ports["rendezvous"]


@needs_kubectl
def test_a_renamed_job_keeps_its_rendezvous_name_consistent(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [os.path.relpath(OVERLAYS_DIR / "multi-node", tmp_path)], "namePrefix": "exp1-"})
    )
    docs = render(tmp_path)
    job, service = only(docs, "Job"), only(docs, "Service")
    assert job["metadata"]["name"] == service["metadata"]["name"] == "exp1-trainstack"
    assert job["spec"]["template"]["spec"]["subdomain"] == "exp1-trainstack"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "exp1-trainstack"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_podmonitor_selects_the_trainer_pods_and_scrapes_the_exporter(rendered, overlay):
    docs = rendered[overlay]
    pod, container = trainer_pod(docs)
    podmonitor = only(docs, "PodMonitor")
    labels = pod["metadata"]["labels"]
    assert podmonitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    exporter_port = int(arg_value(container["args"], "--exporter-port"))
    endpoint = podmonitor["spec"]["podMetricsEndpoints"][0]
    prometheus = yaml.safe_load((ROOT / "monitoring/prometheus/prometheus.yml").read_text())
    assert endpoint["interval"] == prometheus["global"]["scrape_interval"], "the rules' rate windows assume it"
    if "port" in endpoint:
        assert {p["name"]: p["containerPort"] for p in container["ports"]}[endpoint["port"]] == exporter_port
    else:  # the TrainJob's pod declares no exporter port: the address is rewritten to it
        rewrite = next(r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__")
        assert rewrite["replacement"].endswith(f":{exporter_port}")
        keep = next(r for r in endpoint["relabelings"] if r["action"] == "keep")
        assert re.fullmatch(keep["regex"], container["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rules_and_dashboards_carry_the_labels_kube_prometheus_stack_selects(rendered, overlay):
    docs = rendered[overlay]
    release = only(docs, "PodMonitor")["metadata"]["labels"]["release"]
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rules and all(r["metadata"]["labels"]["release"] == release for r in rules)
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    assert dashboards and all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in dashboards)


# The Kubeflow Trainer overlay repeats the Job's pod settings in TrainJob runtime patches; these keep them equal.


def test_trainjob_pod_settings_match_the_job(rendered):
    job_pod, job_container = trainer_pod(rendered["multi-node"])
    train_pod, train_container = trainer_pod(rendered["kubeflow-trainer"])
    assert train_container["args"] == job_container["args"]
    assert train_container["image"] == job_container["image"]
    assert train_container["resources"] == {k: job_container["resources"][k] for k in ("requests", "limits")}
    for field in ("securityContext", "volumeMounts"):
        assert train_container[field] == job_container[field], field
    for field in ("securityContext", "tolerations", "terminationGracePeriodSeconds", "volumes"):
        assert train_pod["spec"][field] == job_pod["spec"][field], field
    assert train_pod["metadata"]["labels"] == job_pod["metadata"]["labels"]


def test_trainjob_runs_one_rank_per_gpu_on_the_torch_runtime(rendered):
    trainjob = only(rendered["kubeflow-trainer"], "TrainJob")
    trainer = trainjob["spec"]["trainer"]
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainer["numNodes"] >= 2
    # The launcher reads PET_NPROC_PER_NODE; the runtime's default `auto` is not a number.
    assert trainer["numProcPerNode"] == int(trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"])
    assert not [e for e in trainer.get("env", []) if e["name"].startswith("PET_")], "the Trainer sets PET_* itself"
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"
    assert patch["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"
