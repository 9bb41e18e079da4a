"""Checkpoints that are never half-written: save to a temporary folder, seal it with a manifest, rename.

`Accelerator.save_state` writes model, optimizer, scheduler, grad scaler and each rank's RNG state; this module
adds the training position (`train_state.json`) and a manifest of every file's size and SHA-256, written last.
A folder named `step-<N>` therefore always holds a complete checkpoint, and a truncated or edited file is caught
before anything is loaded. Accelerate loads with `torch.load(weights_only=True)`, so no code in a checkpoint runs.

Under --strategy fsdp, save_state writes the model and the optimizer as torch.distributed.checkpoint shards, each
rank its own (`pytorch_model_fsdp_0/`, `optimizer_0/`): the manifest covers them like any other file. DCP reads
each folder's `.metadata` with pickle, though, so load FSDP checkpoints only from where you trust the writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.rundir import SHOWN, STEP_DIR, UNSEALED_GLOB, VERIFIED_CHECKPOINT_ENV
from trainstack.train.rank.specs import BUILTIN_PREFIX

MANIFEST = "trainstack.json"
TRAIN_STATE = "train_state.json"
MANIFEST_VERSION = 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def seal(folder: Path, train_state: dict) -> None:
    """Write the training position and the manifest, flushed to disk, so the rename that follows publishes data."""
    (folder / TRAIN_STATE).write_text(json.dumps(train_state, indent=2))
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync(path)
        files[str(path.relative_to(folder))] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"version": MANIFEST_VERSION, "files": files}, indent=2))
    _fsync(manifest)
    _fsync(folder)


def publish(temporary: Path, final: Path) -> None:
    os.replace(temporary, final)
    _fsync(final.parent)


def verify(folder: Path, hashes: bool = True) -> dict:
    """Return the training position of a complete, untouched checkpoint; raise ConfigError saying what is wrong."""
    manifest_path = folder / MANIFEST
    if not folder.is_dir():
        raise ConfigError(f"checkpoint {folder} does not exist; pass a step-N folder under {SHOWN.checkpoints}")
    if not manifest_path.is_file():
        raise ConfigError(
            f"{folder} is not a complete trainstack checkpoint (no {MANIFEST}); pick another with --resume PATH "
            "or start fresh with --resume never and a new --output-dir"
        )
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"checkpoint {folder}: {MANIFEST} is unreadable; the checkpoint cannot be trusted") from None
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise ConfigError(f"checkpoint {folder} is missing {name}; resume from an older checkpoint")
        if path.stat().st_size != expected["bytes"]:
            raise ConfigError(
                f"checkpoint {folder}: {name} is {path.stat().st_size} bytes, expected {expected['bytes']} "
                "(truncated); resume from an older checkpoint"
            )
        if hashes and _sha256(path) != expected["sha256"]:
            raise ConfigError(
                f"checkpoint {folder}: {name} does not match its recorded SHA-256 (modified or corrupted); "
                "resume from an older checkpoint"
            )
    if TRAIN_STATE not in files:
        raise ConfigError(f"checkpoint {folder} has no {TRAIN_STATE}; it was not written by trainstack")
    return read_train_state(folder)


def read_train_state(folder: Path) -> dict:
    return json.loads((folder / TRAIN_STATE).read_text())


def require_strategy(folder: Path, train_state: dict, strategy: str) -> None:
    """A DDP checkpoint holds the full model in model.safetensors, an FSDP one DCP shards: neither loads as the
    other. Checkpoints from before --strategy existed are DDP's."""
    saved = train_state.get("strategy", "ddp")
    if saved != strategy:
        raise ConfigError(
            f"checkpoint {folder} was written with --strategy {saved}; resume it with --strategy "
            f"{saved}, or start a new --output-dir from its weights (`trainstack export`)"
        )


def weights_shape(model: str, seq_len: int) -> dict:
    """What fixes the shapes of a run's weights, as its checkpoints record it: the model, and for a builtin one the
    sequence length its position embeddings are sized for (a factory's model decides that for itself)."""
    return {"model": model, **({"seq_len": seq_len} if model.startswith(BUILTIN_PREFIX) else {})}


def require_same_weights(folder: Path, train_state: dict, shape: dict) -> None:
    """A checkpoint loads only into weights of its own shapes; a resume with another --model or --seq-len would
    fail in every rank on each mismatched tensor. Checkpoints from before the shape was recorded are not checked."""
    saved = {key: train_state[key] for key in shape if key in train_state}
    if saved and saved != {key: shape[key] for key in saved}:
        flags = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in saved.items())
        raise ConfigError(
            f"checkpoint {folder} holds the weights of {flags}; resume it with the same, or start a new "
            "--output-dir (from its weights: `trainstack export`)"
        )


def batches_per_rank(train_state: dict, world_size: int) -> int:
    """Where each rank of this world resumes reading the epoch. The ranks take the epoch's batches in turns (rank
    r reads batches r, r + W, ...) from an order that depends on the seed and epoch only, so a resume at another
    world size starts at the same global batch; when the count does not divide, up to W - 1 batches are reread."""
    saved_world = train_state.get("world_size", world_size)
    return train_state["batch_in_epoch"] * saved_world // world_size


def complete_checkpoints(root: Path) -> list[Path]:
    """Sealed checkpoints, oldest first (names sort by step)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / MANIFEST).is_file())


def newest_intact(root: Path) -> Path | None:
    """The newest sealed checkpoint whose files all have their recorded sizes. Sizes, not hashes: it is named in a
    failure's last line, and hashing gigabytes there would delay the exit; the resume hashes it in full."""
    for folder in reversed(complete_checkpoints(root)):
        try:
            verify(folder, hashes=False)
        except (ConfigError, OSError, ValueError, KeyError):
            continue
        return folder
    return None


def resume_note(root: Path) -> str:
    """What rerunning the same command starts from, for the line a write failure ends on."""
    folder = newest_intact(root)
    if folder is None:
        return "no checkpoint was saved yet: a rerun starts from step 0"
    return f"a rerun of the same command resumes from {folder} (step {read_train_state(folder)['step']})"


def latest_valid(root: Path, warn) -> Path | None:
    """The newest checkpoint that verifies. Newer damaged ones are renamed `<name>.damaged` (never deleted) so
    that training can save those steps again; if none verifies, nothing is touched and the run is refused."""
    candidates = complete_checkpoints(root)
    damaged = []
    for folder in reversed(candidates):
        try:
            verify(folder)
        except ConfigError as problem:
            damaged.append((folder, problem))
            continue
        for bad, reason in damaged:
            os.replace(bad, bad.with_name(bad.name + ".damaged"))
            warn(f"{reason}; kept as {bad.name}.damaged, resuming from {folder.name}")
        return folder
    if candidates:
        raise ConfigError(
            f"none of the {len(candidates)} checkpoints in {root} is intact ({damaged[0][1]}); resume from a good "
            "copy with --resume PATH or start a new run with another --output-dir"
        )
    return None


def resolve_resume(resume: str, root: Path, warn) -> Path | None:
    """The checkpoint a run starts from: None for a fresh start. Raises ConfigError for an unusable request."""
    if resume == "never":
        if complete_checkpoints(root):
            raise ConfigError(
                f"{root.parent} already holds checkpoints and --resume is never; use --resume auto to continue "
                "that run or a new --output-dir to start another (nothing was overwritten)"
            )
        return None
    if resume == "auto":
        return latest_valid(root, warn)
    folder = Path(resume)
    verify(folder, hashes=os.environ.get(VERIFIED_CHECKPOINT_ENV) != str(folder))
    return folder


def rotate(root: Path, keep: int) -> None:
    for folder in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(folder)


def remove_unsealed(root: Path) -> None:
    """Leftovers of a save that was killed part-way: never loadable, safe to delete."""
    if root.is_dir():
        for folder in root.glob(UNSEALED_GLOB):
            shutil.rmtree(folder, ignore_errors=True)
