"""The room one checkpoint takes, from the model's real size: its parameters plus AdamW's two moments per
parameter, all fp32 (mixed precision keeps fp32 weights and optimizer state). Accelerate's RNG, scheduler and
sampler files add a few KiB.

Only built-in models on built-in data are sized, from their shapes and vocabulary (no torch in the launcher). A
factory is the user's code, which may download or allocate, and a file's vocabulary is known only once it is
read, so for those there is no estimate.
"""

from __future__ import annotations

from trainstack.train.rank.specs import BUILTIN_MODELS, BUILTIN_PREFIX, BUILTIN_VOCAB

ADAMW_STATES_PER_PARAMETER = 2  # exp_avg and exp_avg_sq, each the parameter's size
FP32_BYTES = 4


def estimate_checkpoint_bytes(train) -> int | None:
    """Bytes of one checkpoint of the run `train` (a TrainConfig) describes, or None when it cannot be known."""
    if not (train.model.startswith(BUILTIN_PREFIX) and train.dataset.startswith(BUILTIN_PREFIX)):
        return None
    shape = BUILTIN_MODELS.get(train.model.removeprefix(BUILTIN_PREFIX))
    if shape is None:
        return None  # the config check names the unknown model
    weights = shape.parameter_count(BUILTIN_VOCAB, train.seq_len) * FP32_BYTES
    return weights * (1 + ADAMW_STATES_PER_PARAMETER)
