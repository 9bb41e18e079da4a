"""A transformers Trainer run that trainstack monitors: a small GPT-2 trained from scratch on random tokens.

    trainstack watch -- torchrun --nproc_per_node 2 examples/hf_trainer.py --output-dir runs/hf-example

The two lines marked `# trainstack` are all it adds to a Trainer script (docs/hf-callback.md). Swap in your own
model, dataset and collator; tests/unit/trainstack/test_hf_callback.py runs this very file.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainstack.integrations.hf import TrainstackCallback  # trainstack

SEQ_LEN = 64
VOCAB_SIZE = 256  # byte-level token ids: no tokenizer to download


class RandomTokens(torch.utils.data.Dataset):
    """Stands in for your dataset: fixed random token ids, the same on every rank."""

    def __init__(self, samples: int, seed: int):
        self.ids = torch.randint(VOCAB_SIZE, (samples, SEQ_LEN), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index]}


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    input_ids = torch.stack([sample["input_ids"] for sample in samples])
    # GPT-2 shifts the labels itself: each position learns the next token.
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids}


def build_trainer(args: TrainingArguments) -> Trainer:
    # Random init from a config: nothing to download. GPT-2's own special tokens lie outside this vocabulary.
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_positions=SEQ_LEN,
            n_embd=64,
            n_layer=2,
            n_head=2,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(512, seed=0),
        eval_dataset=RandomTokens(64, seed=1),
        data_collator=collate,
    )
    trainer.add_callback(TrainstackCallback(trainer))  # trainstack
    return trainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="where the Trainer writes its checkpoints")
    parser.add_argument("--max-steps", type=int, default=500, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step")
    options = parser.parse_args(argv)
    args = TrainingArguments(
        output_dir=options.output_dir,
        max_steps=options.max_steps,
        per_device_train_batch_size=options.batch_size,
        learning_rate=3e-4,
        # a logged loss in each of trainstack's records (one every 10 steps)
        logging_steps=10,
        eval_strategy="steps",
        eval_steps=100,
        save_strategy="no",
        report_to="none",
        # GPT-2 uses every parameter: spare DDP its search for unused ones each step
        ddp_find_unused_parameters=False,
        # without GPUs, torchrun's ranks train on the CPU (gloo), not each alone
        use_cpu=not torch.cuda.is_available(),
    )
    build_trainer(args).train()


if __name__ == "__main__":
    main()
