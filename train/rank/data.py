"""Datasets and batching: the built-in sequences, local files and hub names through `datasets`, user factories.

Every source ends as a map-style dataset of `{"input_ids": [int, ...]}` records of varying length; `collate`
pads each batch to its own longest sample and masks the padding out of the loss. Sharding across ranks is not
done here: `Accelerator.prepare` gives each rank its own slice of the sampler's order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trainstack.errors import ConfigError
from trainstack.train.rank.specs import (
    BUILTIN_DATASET_NAMES,
    BUILTIN_PREFIX,
    BUILTIN_VOCAB,
    check_dataset_spec,
    is_factory,
    load_factory,
    local_data_files,
    looks_like_path,
)

IGNORE_INDEX = -100  # torch's cross_entropy default: padded positions contribute nothing to the loss
BYTE_VOCAB = 256  # text is tokenized as UTF-8 bytes: no tokenizer download, works offline


@dataclass
class TokenData:
    train: Any
    eval: Any
    vocab_size: int


class ArithmeticSequences(torch.utils.data.Dataset):
    """Built-in data: sequences x_i = (start + i * stride) mod vocab of random length.

    Predicting the next token needs the stride, which only the earlier tokens reveal, so a small transformer's
    loss falls from ln(vocab) towards zero: visible learning in a few hundred CPU steps.
    """

    def __init__(self, count: int, vocab_size: int, min_len: int, max_len: int, seed: int):
        rng = random.Random(seed)
        self.samples = []
        for _ in range(count):
            start, stride = rng.randrange(vocab_size), rng.randrange(1, 8)
            length = rng.randint(min_len, max_len)
            self.samples.append([(start + i * stride) % vocab_size for i in range(length)])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": self.samples[index]}


def _builtin_sequences(seq_len: int, seed: int) -> TokenData:
    vocab = BUILTIN_VOCAB
    min_len = min(16, seq_len)
    return TokenData(
        train=ArithmeticSequences(4096, vocab, min_len, seq_len, seed),
        eval=ArithmeticSequences(256, vocab, min_len, seq_len, seed + 1),
        vocab_size=vocab,
    )


def _builtin_full_sequences(seq_len: int, seed: int) -> TokenData:
    """The CUDA default: every sample exactly seq_len tokens, so no step computes on padding."""
    vocab = BUILTIN_VOCAB
    return TokenData(
        train=ArithmeticSequences(4096, vocab, seq_len, seq_len, seed),
        eval=ArithmeticSequences(256, vocab, seq_len, seq_len, seed + 1),
        vocab_size=vocab,
    )


BUILTIN_DATASETS = dict(zip(BUILTIN_DATASET_NAMES, (_builtin_sequences, _builtin_full_sequences), strict=True))


def load_token_data(
    spec: str, text_field: str, seq_len: int, eval_fraction: float, seed: int, factory_config: Any
) -> TokenData:
    if spec.startswith(BUILTIN_PREFIX):
        check_dataset_spec(spec)
        data = BUILTIN_DATASETS[spec[len(BUILTIN_PREFIX) :]](seq_len, seed)
        # Its evaluation set is its own, not a share of the training data; none is still none.
        return data if eval_fraction > 0 else replace(data, eval=[])
    if is_factory(spec):
        dataset = _checked_factory_dataset(load_factory(spec, "dataset")(factory_config), spec)
        return _split(dataset, eval_fraction, seed, _vocab_size(dataset))
    import datasets

    if looks_like_path(spec):
        builder, files = local_data_files(Path(spec).expanduser())
        try:
            raw = datasets.load_dataset(builder, data_files=files, split="train")
        except Exception as error:  # datasets raises many types for unreadable files; all mean "bad input"
            raise ConfigError(f"dataset {spec} could not be read: {str(error).splitlines()[0]}") from None
    else:
        try:
            raw = datasets.load_dataset(spec, split="train")
        except Exception as error:  # offline, unknown name, gated: all are the user's input
            raise ConfigError(
                f"dataset {spec!r} is not a local path, a builtin: name or a module:function factory, and the "
                f"Hugging Face Hub could not provide it ({str(error).splitlines()[0]})"
            ) from None
    tokenized = _tokenize(raw, text_field, seq_len, spec)
    return _split(tokenized, eval_fraction, seed, _vocab_size(tokenized))


def _checked_factory_dataset(dataset, spec: str):
    """What a `module:function` dataset factory returned, if it is what training reads (module docstring): a
    map-style dataset of at least 2 samples, the first a mapping with `input_ids`. Else one line, before its
    vocabulary is read or a rank's loader trips on it."""
    try:
        count = len(dataset)
        first = dataset[0] if count else None
    except (TypeError, KeyError, IndexError) as error:
        raise ConfigError(
            f"dataset factory {spec!r} returned a {type(dataset).__name__}, not a map-style dataset "
            f"(len() and [index]): {type(error).__name__}: {error}"
        ) from None
    if count < 2:
        raise ConfigError(f"dataset factory {spec!r} returned {count} samples; training needs at least 2")
    if not (isinstance(first, Mapping) and "input_ids" in first):
        shown = sorted(first) if isinstance(first, Mapping) else type(first).__name__
        raise ConfigError(
            f"dataset factory {spec!r}: each sample must be a mapping with 'input_ids' (a list of token ids); "
            f"the first is {shown}"
        )
    return dataset


def _tokenize(raw, text_field: str, seq_len: int, spec: str):
    if "input_ids" in raw.column_names:
        return raw.map(
            lambda r: {"input_ids": r["input_ids"][:seq_len]},
            remove_columns=[c for c in raw.column_names if c != "input_ids"],
        )
    if text_field not in raw.column_names:
        raise ConfigError(
            f"dataset {spec}: no column {text_field!r} (columns: {', '.join(raw.column_names)}); "
            "name the text column with --text-field"
        )
    tokenized = raw.map(
        lambda r: {"input_ids": list(r[text_field].encode("utf-8"))[:seq_len]},
        remove_columns=raw.column_names,
    )
    return tokenized.filter(lambda r: len(r["input_ids"]) >= 2)


def _vocab_size(dataset) -> int:
    declared = getattr(dataset, "vocab_size", None)
    if declared:
        return int(declared)
    if hasattr(dataset, "column_names"):  # a datasets.Dataset: one vectorised pass
        import pyarrow.compute as pc

        largest = pc.max(pc.list_flatten(dataset.data.column("input_ids"))).as_py()
    else:
        largest = max(max(dataset[i]["input_ids"]) for i in range(len(dataset)))
    return max(BYTE_VOCAB, int(largest) + 1)


def _split(dataset, eval_fraction: float, seed: int, vocab_size: int) -> TokenData:
    count = len(dataset)
    if count < 2:
        raise ConfigError(f"the dataset has {count} usable samples; training needs at least 2")
    eval_count = min(count - 1, max(1, round(count * eval_fraction))) if eval_fraction > 0 else 0
    order = list(range(count))
    random.Random(seed).shuffle(order)
    subset = torch.utils.data.Subset
    return TokenData(subset(dataset, order[eval_count:]), subset(dataset, order[:eval_count]), vocab_size)


def collate(
    samples: list[dict[str, Any]], pad_to_multiple_of: int = 1, max_width: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad to the batch's longest sample rounded up to a multiple of `pad_to_multiple_of`, but not past
    `max_width` (the model's --seq-len) unless a sample is longer; causal attention never looks right, so the
    mask is the labels'. With multiples of --bucket-size this is the compiled model's small set of shapes."""
    lengths = [len(s["input_ids"]) for s in samples]
    width = -(-max(lengths) // pad_to_multiple_of) * pad_to_multiple_of
    if max_width is not None:
        width = max(min(width, max_width), max(lengths))
    input_ids = torch.zeros(len(samples), width, dtype=torch.long)
    attention_mask = torch.zeros(len(samples), width, dtype=torch.long)
    for row, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
        input_ids[row, :length] = torch.as_tensor(sample["input_ids"], dtype=torch.long)
        attention_mask[row, :length] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
