"""`TrainstackCallback`: trainstack's per-rank telemetry (trainstack.monitor) for a Lightning `Trainer` run
(`lightning.pytorch`), from its callback hooks (trainstack/integrations/lightning_hooks.py says what they time).
docs/lightning-callback.md shows it in use and says what each figure brackets. For the standalone `pytorch_lightning`
package's Trainer: trainstack.integrations.pytorch_lightning.

    trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[TrainstackCallback()])
    trainer.fit(model, train_loader, val_loader)
"""

from __future__ import annotations

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as missing:
    if missing.name not in ("lightning", "lightning.pytorch"):
        raise  # lightning is there but broken: its own error says why
    raise ImportError("trainstack.integrations.lightning needs lightning: pip install trainstack[lightning]") from None

from lightning.pytorch.utilities.data import extract_batch_size

from trainstack.integrations.lightning_hooks import LightningHooks


class TrainstackCallback(LightningHooks, pl.Callback):
    """trainstack's callback for a `lightning.pytorch` Trainer: what it records, and its options, are LightningHooks'."""

    batch_size_of = staticmethod(extract_batch_size)
