"""A transformers `Trainer` with no trainstack line: a BatchNorm model over token ids on CPU ranks, nothing
downloaded (`torchrun ... hf_plain.py OUT STEPS`). tests/process/test_auto_instrument.py runs it under
`trainstack watch`, which adds trainstack's transformers callback by itself."""

import sys

import torch
from transformers import Trainer, TrainingArguments

VOCAB, WIDTH, SEQUENCE, BATCH = 64, 16, 8, 8


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.out = torch.nn.Linear(WIDTH, 1)

    def forward(self, input_ids, labels=None):
        predicted = self.out(self.norm(self.embed(input_ids).mean(1))).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(predicted, labels), "logits": predicted}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, size: int):
        self.ids = torch.randint(0, VOCAB, (size, SEQUENCE), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index].float().mean()}


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    arguments = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    Trainer(model=Regressor(), args=arguments, train_dataset=Tokens(2 * BATCH * steps)).train()


if __name__ == "__main__":
    main()
