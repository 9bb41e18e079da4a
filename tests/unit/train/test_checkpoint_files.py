"""Checkpoints as files, without training: a sealed folder verifies and any damage is named; resume picks the newest
intact one and sets damaged ones aside; rotation keeps the newest; the Checkpointer runs those steps in the order
that keeps a checkpoint whole (train/rank/checkpoint.py, checkpointer.py). tests/process/test_train_checkpoint.py checks
the same with real ranks, SIGTERM and SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from trainstack.errors import ConfigError
from trainstack.rundir import VERIFIED_CHECKPOINT_ENV, RunDir, step_dir_name
from trainstack.train.rank import checkpoint
from trainstack.train.rank.checkpointer import Checkpointer, drop_tied_aliases
from trainstack.train.rank.progress import Progress
from trainstack.train.rank.segments import SEGMENTS_KEY, RunRecord

TINY_GPT = checkpoint.weights_shape("builtin:tiny-gpt", 128)

FILES = {"model.safetensors": b"model weights", "optimizer.bin": b"optimizer state", "random_states_0.pkl": b"rng"}


def sealed(root: Path, step: int, files: dict[str, bytes] = FILES) -> Path:
    """A checkpoint as the Checkpointer publishes it: written to `.tmp-step-N`, sealed, renamed to `step-N`."""
    layout = RunDir(root.parent)
    temporary = layout.unsealed_checkpoint(step)
    temporary.mkdir(parents=True)
    for name, data in files.items():
        (temporary / name).write_bytes(data)
    checkpoint.seal(temporary, {"step": step, "epoch": 0})
    checkpoint.publish(temporary, layout.checkpoint(step))
    return layout.checkpoint(step)


@pytest.fixture
def root(tmp_path) -> Path:
    return RunDir(tmp_path / "run").checkpoints


# ---- verify ----------------------------------------------------------------------------------------------------


def test_a_sealed_checkpoint_verifies_and_gives_its_training_position(root):
    folder = sealed(root, 5)
    assert checkpoint.verify(folder) == {"step": 5, "epoch": 0}
    manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
    assert set(manifest["files"]) == {*FILES, checkpoint.TRAIN_STATE}


def damage(folder: Path, how: str) -> None:
    model = folder / "model.safetensors"
    if how == "missing file":
        model.unlink()
    elif how == "truncated":
        model.write_bytes(model.read_bytes()[:-1])
    elif how == "modified":  # same size, other bytes: only the hash can tell
        model.write_bytes(model.read_bytes().upper())
    elif how == "no manifest":
        (folder / checkpoint.MANIFEST).unlink()
    elif how == "unreadable manifest":
        (folder / checkpoint.MANIFEST).write_text("{")
    elif how == "not trainstack's":
        manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
        del manifest["files"][checkpoint.TRAIN_STATE]
        (folder / checkpoint.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing file", "is missing model.safetensors; resume from an older checkpoint"),
        ("truncated", "model.safetensors is 12 bytes, expected 13 (truncated)"),
        ("modified", "model.safetensors does not match its recorded SHA-256 (modified or corrupted)"),
        ("no manifest", f"is not a complete trainstack checkpoint (no {checkpoint.MANIFEST})"),
        ("unreadable manifest", f"{checkpoint.MANIFEST} is unreadable; the checkpoint cannot be trusted"),
        ("not trainstack's", f"has no {checkpoint.TRAIN_STATE}; it was not written by trainstack"),
    ],
)
def test_damage_is_named_in_one_line(root, how, message):
    folder = sealed(root, 5)
    damage(folder, how)
    with pytest.raises(ConfigError) as refused:
        checkpoint.verify(folder)
    assert message in str(refused.value) and str(folder) in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_missing_folder_is_refused_with_where_to_look(root):
    with pytest.raises(ConfigError, match="does not exist; pass a step-N folder under"):
        checkpoint.verify(root / step_dir_name(5))


def test_sizes_only_skips_the_hashes_but_not_the_sizes(root):
    """The launcher hashes the checkpoint it resumes once; the ranks it starts check sizes only."""
    modified, truncated = sealed(root, 5), sealed(root, 6)
    damage(modified, "modified")
    damage(truncated, "truncated")
    assert checkpoint.verify(modified, hashes=False)["step"] == 5
    with pytest.raises(ConfigError, match="truncated"):
        checkpoint.verify(truncated, hashes=False)


# ---- the newest valid one --------------------------------------------------------------------------------------


def test_only_sealed_step_folders_are_checkpoints_oldest_first(root):
    kept = [sealed(root, step) for step in (10, 5, 20)]
    (root / ".tmp-step-00000030").mkdir()  # a save in progress or killed part-way
    (root / "step-00000025").mkdir()  # renamed without a manifest: never published by trainstack
    (root / "step-00000015.damaged").mkdir()
    assert checkpoint.complete_checkpoints(root) == sorted(kept)
    assert checkpoint.complete_checkpoints(root / "absent") == []


def test_the_newest_intact_checkpoint_wins_and_newer_damaged_ones_are_set_aside(root):
    oldest, middle, newer, newest = (sealed(root, step) for step in (5, 10, 15, 20))
    damage(newest, "truncated")
    damage(newer, "modified")
    said = []
    assert checkpoint.latest_valid(root, said.append) == middle
    assert checkpoint.complete_checkpoints(root) == [oldest, middle]
    assert {p.name for p in root.iterdir()} == {
        oldest.name,
        middle.name,
        newer.name + ".damaged",
        newest.name + ".damaged",
    }
    assert [line.split("; kept as ")[1] for line in said] == [
        "step-00000020.damaged, resuming from step-00000010",
        "step-00000015.damaged, resuming from step-00000010",
    ]
    assert "truncated" in said[0] and "SHA-256" in said[1]


def test_when_none_is_intact_the_run_is_refused_and_nothing_moves(root):
    folders = [sealed(root, step) for step in (5, 10)]
    for folder in folders:
        damage(folder, "missing file")
    with pytest.raises(ConfigError, match="none of the 2 checkpoints in .* is intact"):
        checkpoint.latest_valid(root, pytest.fail)
    assert checkpoint.complete_checkpoints(root) == folders


def test_no_checkpoint_is_a_fresh_start(root):
    assert checkpoint.latest_valid(root, pytest.fail) is None


def test_resume_never_refuses_a_directory_that_holds_checkpoints(root):
    assert checkpoint.resolve_resume("never", root, pytest.fail) is None
    sealed(root, 5)
    with pytest.raises(ConfigError, match="already holds checkpoints and --resume is never"):
        checkpoint.resolve_resume("never", root, pytest.fail)


def test_resume_auto_is_the_newest_intact_and_a_path_is_verified(root, monkeypatch):
    older, newest = sealed(root, 5), sealed(root, 10)
    assert checkpoint.resolve_resume("auto", root, pytest.fail) == newest
    damage(older, "modified")
    with pytest.raises(ConfigError, match="SHA-256"):
        checkpoint.resolve_resume(str(older), root, pytest.fail)
    monkeypatch.setenv(VERIFIED_CHECKPOINT_ENV, str(older))  # the launcher hashed it: the ranks check sizes only
    assert checkpoint.resolve_resume(str(older), root, pytest.fail) == older


def test_unsealed_leftovers_are_removed_and_nothing_else(root):
    kept = sealed(root, 5)
    (root / ".tmp-step-00000010").mkdir()
    (root / ".tmp-step-00000010" / "model.safetensors").write_bytes(b"half")
    checkpoint.remove_unsealed(root)
    assert list(root.iterdir()) == [kept]
    checkpoint.remove_unsealed(root / "absent")


# ---- rotate ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("keep", "left"), [(1, [20]), (2, [15, 20]), (4, [5, 10, 15, 20]), (9, [5, 10, 15, 20])])
def test_rotation_keeps_the_newest_and_touches_nothing_unsealed(root, keep, left):
    for step in (5, 10, 15, 20):
        sealed(root, step)
    (root / ".tmp-step-00000025").mkdir()
    (root / "step-00000001.damaged").mkdir()
    checkpoint.rotate(root, keep)
    assert [int(p.name.split("-")[1]) for p in checkpoint.complete_checkpoints(root)] == left
    assert (root / ".tmp-step-00000025").is_dir() and (root / "step-00000001.damaged").is_dir()


# ---- the Checkpointer ----------------------------------------------------------------------------------------


class OneRank:
    """The part of Accelerate's Accelerator the Checkpointer uses, for one process: save_state writes the files
    a real one would, load_state records what it loaded."""

    is_main_process = True
    num_processes = 1

    def __init__(self):
        self.loaded: list[str] = []
        self.said: list[str] = []

    @contextlib.contextmanager
    def main_process_first(self):
        yield

    def wait_for_everyone(self):
        pass

    def save_state(self, folder: str):
        for name, data in FILES.items():
            (Path(folder) / name).write_bytes(data)

    def load_state(self, folder: str):
        self.loaded.append(folder)

    def print(self, line: str):
        self.said.append(line)


def trained(step: int) -> Progress:
    return Progress(
        step=step, epoch=1, batch_in_epoch=3, initial_loss=4.0, last_loss=2.5, samples=8 * step, tokens=1024 * step
    )


def test_a_save_publishes_a_sealed_checkpoint_then_rotates(tmp_path):
    layout = RunDir(tmp_path)
    saver = Checkpointer(OneRank(), layout, strategy="ddp", keep=2, shape=TINY_GPT)
    for step in (5, 10, 15):
        progress = trained(step)
        assert saver.save(progress, RunRecord("run", progress)) >= 0
    assert checkpoint.complete_checkpoints(layout.checkpoints) == [layout.checkpoint(10), layout.checkpoint(15)]
    assert not list(layout.checkpoints.glob(".tmp-*"))
    state = checkpoint.verify(layout.checkpoint(15))
    assert {key: state[key] for key in trained(15).state()} == trained(15).state()
    assert (state["world_size"], state["strategy"], state[SEGMENTS_KEY][0]["last_step"]) == (1, "ddp", 15)


def test_a_step_already_saved_is_not_saved_again(tmp_path):
    layout = RunDir(tmp_path)
    saver = Checkpointer(OneRank(), layout, strategy="ddp", keep=3, shape=TINY_GPT)
    saver.save(trained(5), RunRecord("run", trained(5)))
    before = (layout.checkpoint(5) / checkpoint.MANIFEST).read_bytes()
    assert saver.save(trained(5), RunRecord("resumed", trained(5))) is None
    assert (layout.checkpoint(5) / checkpoint.MANIFEST).read_bytes() == before


def test_a_run_that_keeps_no_checkpoint_writes_none(tmp_path):
    layout = RunDir(tmp_path)
    saver = Checkpointer(
        OneRank(), layout, strategy="ddp", keep=0, shape=TINY_GPT
    )  # a throwaway run: trainstack tune's trials
    assert not saver.due(5)
    assert saver.save(trained(5), RunRecord("trial", trained(5))) is None
    assert list(tmp_path.iterdir()) == []


def test_resume_restores_the_position_from_the_newest_intact_checkpoint(tmp_path):
    layout = RunDir(tmp_path)
    Checkpointer(OneRank(), layout, strategy="ddp", keep=3, shape=TINY_GPT).save(
        trained(5), RunRecord("first", trained(5))
    )
    Checkpointer(OneRank(), layout, strategy="ddp", keep=3, shape=TINY_GPT).save(
        trained(10), RunRecord("first", trained(10))
    )
    damage(layout.checkpoint(10), "truncated")
    (layout.checkpoints / ".tmp-step-00000011").mkdir()  # killed mid-save
    rank, progress = OneRank(), Progress()
    segments = Checkpointer(rank, layout, strategy="ddp", keep=3, shape=TINY_GPT).resume("auto", progress)
    assert rank.loaded == [str(layout.checkpoint(5))]
    assert progress == Progress(**trained(5).state(), resumed_from=str(layout.checkpoint(5)))
    assert [segment["last_step"] for segment in segments] == [5]
    assert not (layout.checkpoints / ".tmp-step-00000011").exists()
    assert (layout.checkpoints / "step-00000010.damaged").is_dir()


def test_resume_refuses_a_checkpoint_of_the_other_strategy(tmp_path):
    layout = RunDir(tmp_path)
    Checkpointer(OneRank(), layout, strategy="fsdp", keep=3, shape=TINY_GPT).save(
        trained(5), RunRecord("first", trained(5))
    )
    rank = OneRank()
    with pytest.raises(ConfigError, match="written with --strategy fsdp; resume it with --strategy fsdp"):
        Checkpointer(rank, layout, strategy="ddp", keep=3, shape=TINY_GPT).resume("auto", Progress())
    assert rank.loaded == []
    longer = checkpoint.weights_shape("builtin:tiny-gpt", 256)
    with pytest.raises(ConfigError, match="holds the weights of --model builtin:tiny-gpt --seq-len 128"):
        Checkpointer(rank, layout, strategy="fsdp", keep=3, shape=longer).resume("auto", Progress())
    assert rank.loaded == []  # refused before any rank reads a tensor of it


def test_a_fresh_start_restores_nothing(tmp_path):
    rank, progress = OneRank(), Progress()
    assert Checkpointer(rank, RunDir(tmp_path), strategy="ddp", keep=3, shape=TINY_GPT).resume("auto", progress) == []
    assert (rank.loaded, progress) == ([], Progress())


def test_a_checkpoint_resumes_only_into_weights_of_its_own_shapes(tmp_path):
    builtin = checkpoint.weights_shape("builtin:tiny-gpt", 128)
    assert builtin == {"model": "builtin:tiny-gpt", "seq_len": 128}
    assert checkpoint.weights_shape("mine:build", 128) == {"model": "mine:build"}  # its length is the model's own
    state = {"step": 5, **builtin}
    checkpoint.require_same_weights(tmp_path, state, builtin)
    checkpoint.require_same_weights(tmp_path, {"step": 5}, builtin)  # older checkpoints: not recorded, not checked
    for other in (checkpoint.weights_shape("builtin:tiny-gpt", 64), checkpoint.weights_shape("builtin:small-gpt", 128)):
        with pytest.raises(ConfigError, match=r"holds the weights of --model builtin:tiny-gpt --seq-len 128; resume"):
            checkpoint.require_same_weights(tmp_path, state, other)


def test_an_export_is_readable_as_any_file_the_user_writes_and_loads_with_its_tie(tmp_path):
    from safetensors.torch import load_model

    from trainstack.train.launcher.export import write_safetensors

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as the built-in models' head and token embedding
    weights = [model.state_dict()]
    drop_tied_aliases([model], weights, str(tmp_path))  # as the checkpoint stores it: the tie's first name only
    output = tmp_path / "exports" / "step-5.safetensors"
    previous = os.umask(0o022)
    try:
        write_safetensors(weights[0], output, {"step": "5"})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(output.stat().st_mode) == 0o644  # safetensors alone writes 0600
    fresh = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    fresh[1].weight = fresh[0].weight
    assert load_model(fresh, output) == (set(), [])  # the docs' way: the tie restored, nothing missing
    assert torch.equal(fresh[1].weight, model[0].weight)
