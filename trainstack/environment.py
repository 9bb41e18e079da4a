"""What a run ran on besides its config, per node: the NCCL and threading variables its ranks got, the versions of
Python, torch, Accelerate and trainstack, torch's CUDA build, and the node's GPUs and driver. `trainstack train` and
`trainstack watch` write it (RunDir.environment) as they start the ranks; `trainstack compare` shows where two runs
differ. Only the variables named here are recorded, never the whole environment, which may hold secrets.

Torch-free: watch, and compare, read it without importing torch (seconds)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import platform
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from trainstack.write_failure import write_atomically

RECORDED_PREFIXES = ("NCCL_", "TORCH_NCCL_")
RECORDED_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
PACKAGES = ("torch", "accelerate", "trainstack")


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The recorded variables of `environ`: NCCL's and torch's NCCL switches, the visible GPUs, the threads."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(RECORDED_PREFIXES) or name in RECORDED_NAMES
    }


def torch_cuda() -> str | None:
    """The CUDA version torch was built with (None: a CPU build, or no torch), read from its version.py, which
    importing torch to ask would cost seconds."""
    try:
        source = Path(str(importlib.metadata.distribution("torch").locate_file("torch/version.py"))).read_text()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    found["cuda"] = torch_cuda()
    return found


def gpus() -> dict[str, object]:
    """The node's GPUs (every one NVML sees: CUDA_VISIBLE_DEVICES is recorded beside them) and the driver; {} where
    NVML is not there (no driver, no GPU, no nvidia-ml-py)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, or any NVMLError: no GPUs to describe
        return {}
    try:
        names = [
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        return {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": names}
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def describe(environ: Mapping[str, str]) -> dict[str, object]:
    """This node's environment, as the ranks get `environ`."""
    return {"variables": variables(environ), "versions": versions(), **gpus()}


def write(path: Path, environ: Mapping[str, str]) -> None:
    """Raises WriteFailure when the storage refuses it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(describe(environ), indent=2) + "\n", "the run's environment")


def read(path: Path) -> dict:
    """A recorded environment; {} for one a kill cut short or another program wrote."""
    try:
        described = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return described if isinstance(described, dict) else {}


def settings(nodes: Mapping[int, dict]) -> dict[str, object]:
    """The recorded environments of a run's nodes as compare's settings, one flat name each (`env.NCCL_ALGO`,
    `version.torch`, `gpus`, `driver`); where the nodes differ, each node's value."""
    per_node: dict[str, dict[int, object]] = {}
    for node, described in nodes.items():
        flat = {
            **{f"env.{k}": v for k, v in described.get("variables", {}).items()},
            **{f"version.{k}": v for k, v in described.get("versions", {}).items()},
            **({"driver": described["driver"]} if "driver" in described else {}),
            **({"gpus": _count(described["gpus"])} if "gpus" in described else {}),
        }
        for name, value in flat.items():
            per_node.setdefault(name, {})[node] = value
    return {
        name: values[min(values)]
        if len(set(map(str, values.values()))) == 1 and len(values) == len(nodes)
        else "; ".join(f"node {node}: {values.get(node, '-')}" for node in sorted(nodes))
        for name, values in per_node.items()
    }


def _count(names: list[str]) -> str:
    """["H100", "H100"] -> "2 x H100"; no GPU: "none"."""
    return ", ".join(f"{count} x {name}" for name, count in Counter(names).items()) or "none"
