"""`trainstack export`: a checkpoint's full model weights as one safetensors file, for inference.

It runs offline, in one process, after (or during) training: no GPU, no process group, and no rank gathers the
model while the run trains. An FSDP checkpoint's shards (torch.distributed.checkpoint, any world size) are
assembled in this process's memory; a DDP checkpoint already holds the full weights in model.safetensors. The
output loads into the plain model with safetensors' `load_model` (the keys are the model's own; a tied weight is
stored once, under its first name, and `load_model` ties it back).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.rundir import SHOWN, RunDir, check_run_dir
from trainstack.train.rank import checkpoint

FSDP_MODEL_DIR = "pytorch_model_fsdp_0"  # where Accelerate's save_state puts the first model's DCP shards
DDP_MODEL_FILE = "model.safetensors"
COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper: the plain model has no such level


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        help=f"a checkpoint folder ({SHOWN.checkpoints}/step-N) or a run directory (its newest checkpoint)",
    )
    parser.add_argument(
        "--output",
        help=f"safetensors file to write (default: {SHOWN.exports}/step-N.safetensors);"
        " an existing file is never overwritten",
    )


def run(args: argparse.Namespace) -> int:
    folder = _checkpoint_folder(Path(args.checkpoint))
    state = checkpoint.verify(folder)  # every file against its recorded SHA-256, before anything is read
    output = Path(args.output) if args.output else RunDir(folder.parent.parent).exports / f"{folder.name}.safetensors"
    if output.exists():
        raise ConfigError(f"{output} already exists; pass another --output or move it away (nothing was written)")
    check_run_dir(output.parent, "--output")  # its folder is made if need be: it must be a writable place
    weights = full_weights(folder, state)
    write_safetensors(weights, output, {"checkpoint": str(folder), "step": str(state["step"])})
    print(f"trainstack export: {len(weights)} tensors from {folder} -> {output}", file=sys.stderr)
    return 0


def _checkpoint_folder(path: Path) -> Path:
    if (path / checkpoint.MANIFEST).is_file():
        return path
    found = checkpoint.complete_checkpoints(RunDir(path).checkpoints)
    if not found:
        raise ConfigError(
            f"{path} is neither a checkpoint nor a run directory with checkpoints; pass {SHOWN.checkpoints}/step-N"
        )
    return found[-1]


def full_weights(folder: Path, train_state: dict) -> dict:
    """name -> full tensor, with the model's own parameter names."""
    if train_state.get("strategy", "ddp") == "fsdp":
        weights = read_dcp(folder / FSDP_MODEL_DIR)["model"]
    else:
        from safetensors.torch import load_file

        weights = load_file(folder / DDP_MODEL_FILE)
    return {name.replace(COMPILED_PREFIX, ""): tensor.contiguous() for name, tensor in weights.items()}


def read_dcp(path: Path) -> dict:
    """A DCP folder into plain tensors in this process, resharded to one: the loader that the public
    `dcp_to_torch_save` uses, without its intermediate torch.save file."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def write_safetensors(weights: dict, output: Path, metadata: dict[str, str]) -> None:
    """Written beside the target and renamed: a crash never leaves a half-written file under the final name."""
    from safetensors.torch import save_file

    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    save_file(weights, temporary, metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # as any file the user writes: safetensors makes it 0600
    os.replace(temporary, output)
