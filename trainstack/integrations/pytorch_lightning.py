"""`TrainstackCallback` for the standalone `pytorch_lightning` package's `Trainer`: the callback of
trainstack.integrations.lightning (whose Trainer, `lightning.pytorch`'s, accepts only its own package's Callback),
made from the same hooks (trainstack/integrations/lightning_hooks.py).

    import pytorch_lightning as pl
    from trainstack.integrations.pytorch_lightning import TrainstackCallback

    trainer = pl.Trainer(strategy="ddp", devices=2, callbacks=[TrainstackCallback()])
"""

from __future__ import annotations

try:
    import pytorch_lightning as pl
except ModuleNotFoundError as missing:
    if missing.name != "pytorch_lightning":
        raise  # pytorch_lightning is there but broken: its own error says why
    raise ImportError(
        "trainstack.integrations.pytorch_lightning needs pytorch_lightning: pip install pytorch-lightning"
    ) from None

from pytorch_lightning.utilities.data import extract_batch_size

from trainstack.integrations.lightning_hooks import LightningHooks


class TrainstackCallback(LightningHooks, pl.Callback):
    """trainstack's callback for a `pytorch_lightning` Trainer: what it records, and its options, are LightningHooks'."""

    batch_size_of = staticmethod(extract_batch_size)
