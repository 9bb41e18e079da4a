"""A Lightning `Trainer(strategy="ddp")` with no trainstack line: a BatchNorm model on 2 CPU ranks, launched by
Lightning itself (`python lightning_plain.py STEPS [PACKAGE [gpu]]`; PACKAGE: lightning.pytorch, the default, or the
standalone pytorch_lightning; gpu: on one CUDA GPU instead). tests/process/test_auto_instrument.py and
test_gpu_watch.py run it under `trainstack watch`, which adds trainstack's Lightning callback by itself."""

import importlib
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

pl = importlib.import_module(sys.argv[2] if len(sys.argv) > 2 else "lightning.pytorch")
ON_GPU = sys.argv[3:] == ["gpu"]
WIDTH, BATCH = 16, 16


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.BatchNorm1d(WIDTH), torch.nn.Linear(WIDTH, 1)
        )

    def training_step(self, batch, index):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    steps = int(sys.argv[1])
    torch.set_num_threads(1)
    inputs = torch.randn(2 * BATCH * steps, WIDTH)
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="gpu" if ON_GPU else "cpu",
        devices=1 if ON_GPU else 2,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regressor(), DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=BATCH))


if __name__ == "__main__":
    main()
