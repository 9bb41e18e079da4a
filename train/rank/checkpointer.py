"""The Trainer's checkpoints: every rank saves, the main process seals, publishes and rotates; resume restores.

train/rank/checkpoint.py holds the file-level steps (seal, publish, rotate, verify, resolve); this module runs them
across the ranks with Accelerate's save_state/load_state, in the order that keeps a checkpoint whole.
"""

from __future__ import annotations

import shutil
import time

import torch
from accelerate import Accelerator

from trainstack.rundir import RunDir, Segment
from trainstack.train.rank import checkpoint
from trainstack.train.rank.progress import Progress
from trainstack.train.rank.segments import SEGMENTS_KEY, RunRecord
from trainstack.write_failure import write_failure


class Checkpointer:
    def __init__(self, accelerator: Accelerator, run_dir: RunDir, strategy: str, keep: int, shape: dict):
        self.accelerator = accelerator
        self.run_dir = run_dir
        self.root = run_dir.checkpoints
        self.strategy = strategy
        self.keep = keep
        self.shape = shape  # checkpoint.weights_shape: recorded in each checkpoint, checked on resume

    def resume(self, resume: str, progress: Progress) -> list[Segment]:
        """Restores the state and `progress` from the checkpoint `resume` names (config.resume), if any; returns
        the segments that checkpoint carries."""
        accelerator = self.accelerator
        # The main process goes first: it clears unsealed leftovers and sets damaged checkpoints aside, then the
        # other ranks resolve the same checkpoint from the tidied folder.
        with accelerator.main_process_first():
            if resume == "auto" and accelerator.is_main_process:
                checkpoint.remove_unsealed(self.root)
            folder = checkpoint.resolve_resume(resume, self.root, accelerator.print)
        if folder is None:
            return []
        state = checkpoint.read_train_state(folder)
        checkpoint.require_strategy(folder, state, self.strategy)
        checkpoint.require_same_weights(folder, state, self.shape)
        accelerator.load_state(str(folder))  # FSDP: each rank reads the shards it now owns, at any world size
        p = progress
        p.step, p.epoch = state["step"], state["epoch"]
        p.batch_in_epoch = checkpoint.batches_per_rank(state, accelerator.num_processes)
        p.initial_loss, p.last_loss = state["initial_loss"], state["last_loss"]
        p.evaluations = list(state.get("evaluations", []))  # a checkpoint from before the history: none kept
        p.samples, p.tokens = state["samples"], state["tokens"]
        p.resumed_from = str(folder)
        accelerator.print(f"resumed from {folder} at step {p.step}")
        return state.get(SEGMENTS_KEY, [])

    def due(self, step: int) -> bool:
        """A save at this step writes a checkpoint: the run keeps some (keep 0 is a throwaway run, whose
        checkpoints no one would load) and this step is not saved yet (the run resumed here and stopped again)."""
        return self.keep > 0 and not self.run_dir.checkpoint(step).exists()

    def save(self, progress: Progress, record: RunRecord) -> float | None:
        """Every rank writes its part into a temporary folder; the main process seals and publishes it. Returns
        the seconds it took, or None when nothing is due (`due`)."""
        accelerator, p = self.accelerator, progress
        final = self.run_dir.checkpoint(p.step)
        if not self.due(p.step):
            return None
        started = time.time()
        temporary = self.run_dir.unsealed_checkpoint(p.step)
        try:
            if accelerator.is_main_process:
                checkpoint.remove_unsealed(self.root)
                temporary.mkdir(parents=True)
            accelerator.wait_for_everyone()
            accelerator.save_state(str(temporary))
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                checkpoint.seal(
                    temporary,
                    {
                        **p.state(),
                        "world_size": accelerator.num_processes,
                        "strategy": self.strategy,
                        **self.shape,
                        SEGMENTS_KEY: record.segments(p),
                    },
                )
                checkpoint.publish(temporary, final)
                checkpoint.rotate(self.root, self.keep)
        except (OSError, RuntimeError) as error:
            failure = write_failure(error, f"checkpoint step {p.step}", temporary)
            if failure is None:
                raise
            # Half a checkpoint is never loadable, and its space is what the summary and the report need now. The
            # main process made the folder and writes nearly all of it; the others leave it to the main process,
            # which may still be writing there, or to the next start.
            if accelerator.is_main_process:
                shutil.rmtree(temporary, ignore_errors=True)
            raise failure from None
        accelerator.wait_for_everyone()
        return time.time() - started


def drop_tied_aliases(models, weights: list[dict], output_dir: str) -> None:
    """Accelerate's save_state pre-hook: keep one name per shared tensor (the first, as Accelerate would) in each
    state dict. safetensors cannot store aliases, so Accelerate drops them itself but logs "Removed shared
    tensor ... check that you don't receive any warning while reloading" at every checkpoint; done here, it is
    silent. Loading restores the tie: safetensors' load_model knows which of the model's names share storage."""
    for state in weights:
        seen = set()
        for name in list(state):
            tensor = state[name]
            if not isinstance(tensor, torch.Tensor):
                continue
            key = (
                tensor.device,
                tensor.untyped_storage().data_ptr(),
                tensor.storage_offset(),
                tensor.dtype,
                tuple(tensor.shape),
                tensor.stride(),
            )
            if key in seen:
                del state[name]
            seen.add(key)
