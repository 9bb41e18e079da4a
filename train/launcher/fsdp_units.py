"""Before any rank starts, `train` and `doctor` check that the module classes --fsdp-wrap names occur in a
built-in model. A factory's model is the user's code, checked by the ranks once it exists."""

from __future__ import annotations

from trainstack.train.rank.specs import BUILTIN_PREFIX


def check_fsdp_units(config) -> None:
    if config.strategy != "fsdp" or not config.model.startswith(BUILTIN_PREFIX) or not config.fsdp_wrap:
        return
    # Built on the meta device (no memory), but with torch: only such a launch imports it before the ranks do.
    import torch

    from trainstack.train.rank.model import build_model
    from trainstack.train.rank.sharding import unit_classes

    with torch.device("meta"):
        unit_classes(config, build_model(config, vocab_size=256))
