"""GPU checks: how many GPUs the driver, CUDA_VISIBLE_DEVICES and torch each see (and why they differ), one
rank per GPU, and whether the driver is new enough for torch's CUDA."""

from __future__ import annotations

from collections import Counter

from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status

GPU_RUNTIME_FIX = (
    "start the container with GPUs: docker run --gpus all; compose: deploy.resources.reservations.devices "
    "[{driver: nvidia, count: all, capabilities: [gpu]}]; Kubernetes: resources.limits nvidia.com/gpu: N"
)
# NVIDIA_VISIBLE_DEVICES values with which the NVIDIA container runtime mounts no GPU at all.
NO_GPU_REQUESTED = ("", "void", "none")


def devices_cuda_exposes(cuda_visible_devices: str, uuids: tuple[str, ...]) -> tuple[str, ...]:
    """The GPUs CUDA will expose: it reads the list left to right and stops at the first entry naming no GPU
    (an index out of range, an unknown UUID prefix, "-1", a repeat)."""
    exposed: list[str] = []
    for entry in (part.strip() for part in cuda_visible_devices.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            match: str | None = uuids[int(entry)]
        elif entry.startswith("GPU-"):
            match = next((uuid for uuid in uuids if uuid.startswith(entry)), None)
        elif entry.startswith("MIG-"):
            match = entry  # a MIG instance: NVML's GPU UUIDs cannot vouch for it, trust CUDA
        else:
            match = None
        if match is None or match in exposed:
            break
        exposed.append(match)
    return tuple(exposed)


def _describe(names: tuple[str, ...]) -> str:
    return ", ".join(f"{count} x {name}" for name, count in Counter(names).items())


def check_gpu_visibility(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    env = config.env
    requested = env.get("NVIDIA_VISIBLE_DEVICES")
    if not gpus.driver_found:
        if gpus.torch_device_count:
            return CheckResult(
                "gpus",
                Status.WARN,
                f"torch sees {gpus.torch_device_count} GPU(s) but NVML is missing: no GPU metrics, "
                "and the exporter cannot tell which GPUs sit idle",
                "give the container the driver's 'utility' capability: NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            )
        if requested is not None and requested.strip().lower() not in NO_GPU_REQUESTED:
            return CheckResult(
                "gpus",
                Status.WARN,
                f"NVIDIA_VISIBLE_DEVICES={requested} asks for GPUs but no NVIDIA driver is visible: "
                "the container was started without the NVIDIA runtime, so the ranks run on CPU",
                GPU_RUNTIME_FIX,
            )
        return CheckResult(
            "gpus",
            Status.WARN,
            "no NVIDIA driver: CPU ranks",
            "nothing to do for a CPU run; for GPUs install the NVIDIA driver "
            "(and the NVIDIA Container Toolkit for Docker)",
        )
    if gpus.nvml_error:
        return CheckResult(
            "gpus",
            Status.FAIL,
            f"NVML failed: {gpus.nvml_error}",
            "run nvidia-smi: 'Driver/library version mismatch' means the driver was upgraded without "
            "reloading it (reboot the host); otherwise reinstall the driver",
        )
    total = len(gpus.uuids)
    if total == 0:
        return CheckResult(
            "gpus",
            Status.WARN,
            f"the NVIDIA driver is loaded but shows no GPU (NVIDIA_VISIBLE_DEVICES={requested}): CPU ranks",
            GPU_RUNTIME_FIX,
        )
    if not gpus.torch_cuda_version:
        return CheckResult(
            "gpus",
            Status.FAIL,
            f"{total} GPU(s) ({_describe(gpus.names)}) but torch {gpus.torch_version} is a CPU build",
            "install torch's CUDA build "
            "(pip install torch --index-url https://download.pytorch.org/whl/cu128) or the trainstack image",
        )
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    exposed = devices_cuda_exposes(cuda_visible, gpus.uuids) if cuda_visible is not None else gpus.uuids
    seen = f"NVML sees {total} GPU(s) ({_describe(gpus.names)})"
    if cuda_visible is not None and not exposed:
        return CheckResult(
            "gpus",
            Status.FAIL,
            f"{seen} but CUDA_VISIBLE_DEVICES={cuda_visible!r} hides all of them",
            "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use by index or UUID (nvidia-smi -L)",
        )
    if gpus.torch_device_count != len(exposed):
        because = f" ({gpus.torch_warning})" if gpus.torch_warning else ""
        return CheckResult(
            "gpus",
            Status.FAIL,
            f"{seen}, {len(exposed)} allowed by CUDA_VISIBLE_DEVICES, but torch sees "
            f"{gpus.torch_device_count}{because}",
            "see the cuda-version check (a driver older than torch's CUDA hides every GPU); "
            "python -c 'import torch; torch.cuda.init()' shows CUDA's own error",
        )
    if len(exposed) < total:
        return CheckResult(
            "gpus",
            Status.WARN,
            f"{seen}; CUDA_VISIBLE_DEVICES={cuda_visible} hides {total - len(exposed)}: they sit idle",
            "unset CUDA_VISIBLE_DEVICES to train on every GPU (unless another job owns the hidden ones)",
        )
    if requested and requested.lower() != "all" and len(requested.split(",")) != total:
        return CheckResult(
            "gpus",
            Status.WARN,
            f"{seen} but NVIDIA_VISIBLE_DEVICES={requested} names {len(requested.split(','))}: the variable "
            "only acts when the NVIDIA container runtime starts a container",
            "select GPUs with docker run --gpus '\"device=0,1\"' or, on hosts, CUDA_VISIBLE_DEVICES",
        )
    return CheckResult("gpus", Status.PASS, f"{seen}; torch {gpus.torch_version} sees {gpus.torch_device_count}")


def check_ranks_per_gpu(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    ranks = config.ranks_on_this_node(gpus)
    visible = gpus.torch_device_count
    if visible == 0:
        return CheckResult("ranks", Status.PASS, f"{ranks} CPU rank(s) on this node")
    if ranks > visible:
        return CheckResult(
            "ranks",
            Status.FAIL,
            f"--nproc-per-node {ranks} but torch sees {visible} GPU(s): ranks would share a GPU or fail",
            f"--nproc-per-node {visible} (or leave it unset: one rank per GPU)",
        )
    if ranks < visible:
        return CheckResult(
            "ranks",
            Status.WARN,
            f"--nproc-per-node {ranks} leaves {visible - ranks} of {visible} visible GPUs idle",
            f"--nproc-per-node {visible} (or leave it unset: one rank per GPU)",
        )
    return CheckResult("ranks", Status.PASS, f"one rank per GPU: {ranks}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def check_cuda_version(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    if not (gpus.driver_found and gpus.driver_cuda_version and gpus.torch_cuda_version):
        return CheckResult("cuda-version", Status.PASS, "not applicable: no NVIDIA driver or a CPU build of torch")
    driver, built = _version(gpus.driver_cuda_version), _version(gpus.torch_cuda_version)
    versions = (
        f"driver {gpus.driver_version} supports CUDA {gpus.driver_cuda_version}, "
        f"torch {gpus.torch_version} is built for CUDA {gpus.torch_cuda_version}"
    )
    upgrade = (
        f"upgrade the NVIDIA driver to one supporting CUDA {gpus.torch_cuda_version}, or install a torch "
        f"built for CUDA {gpus.driver_cuda_version} or older"
    )
    if driver[0] < built[0]:
        return CheckResult("cuda-version", Status.FAIL, f"{versions}: CUDA cannot start", upgrade)
    if driver < built:
        return CheckResult(
            "cuda-version",
            Status.WARN,
            f"{versions}: runs through CUDA minor-version compatibility, but kernels needing PTX JIT fail",
            upgrade,
        )
    return CheckResult("cuda-version", Status.PASS, versions)
