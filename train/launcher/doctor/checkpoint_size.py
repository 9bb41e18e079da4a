"""The room one checkpoint takes, from the model's real size: its parameters plus AdamW's two moments per
parameter, all fp32 (mixed precision keeps fp32 weights and optimizer state). Accelerate's RNG, scheduler and
sampler files add a few KiB.

Only built-in models on built-in data are sized: the model is built on the meta device (shapes, no memory, no
weights) with the vocabulary the data declares. A factory is the user's code, which may download or allocate,
and a file's vocabulary is known only once it is read, so for those there is no estimate.
"""

from __future__ import annotations

from trainstack.train.rank.data import BUILTIN_PREFIX

ADAMW_STATES_PER_PARAMETER = 2  # exp_avg and exp_avg_sq, each the parameter's size


def estimate_checkpoint_bytes(train) -> int | None:
    """Bytes of one checkpoint of the run `train` (a TrainConfig) describes, or None when it cannot be known."""
    if not (train.model.startswith(BUILTIN_PREFIX) and train.dataset.startswith(BUILTIN_PREFIX)):
        return None
    import torch

    from trainstack.train.rank.data import load_token_data
    from trainstack.train.rank.model import build_model

    vocab_size = load_token_data(
        train.dataset, train.text_field, train.seq_len, train.eval_fraction, train.seed, train
    ).vocab_size
    with torch.device("meta"):
        model = build_model(train, vocab_size)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied weight is counted once
    return weights * (1 + ADAMW_STATES_PER_PARAMETER)
