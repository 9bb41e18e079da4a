"""Models: a built-in small decoder-only transformer, or the user's `module:function` factory.

The contract (the same as Hugging Face causal LMs, so those plug in unchanged): `model(input_ids=...,
attention_mask=..., labels=...)` returns the mean loss over the labelled tokens, either as a tensor or as an
object with `.loss` (and optionally `.logits`, which evaluation uses for an exact per-token mean).
A factory is called as `factory(config, vocab_size)` and returns an `nn.Module`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainstack.errors import ConfigError
from trainstack.train.rank.data import IGNORE_INDEX
from trainstack.train.rank.specs import BUILTIN_MODELS, BUILTIN_PREFIX, GPTShape, check_model_spec, load_factory


@dataclass
class CausalLMOutput:
    """A dataclass, not a namespace: DDP's find_unused_parameters looks for the output's tensors inside it."""

    loss: torch.Tensor | None
    logits: torch.Tensor


# A pytree node, so that DDP's static graph (--ddp-static-graph) sees the tensors inside it: its first step's
# all-reduce is queued from their gradients, and an output it cannot look into leaves the gradients unreduced,
# silently (each rank then trains on its own).
torch.export.register_dataclass(CausalLMOutput)


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.heads = shape.heads
        self.norm1 = nn.LayerNorm(shape.width)
        self.qkv = nn.Linear(shape.width, 3 * shape.width)
        self.proj = nn.Linear(shape.width, shape.width)
        self.norm2 = nn.LayerNorm(shape.width)
        self.mlp = nn.Sequential(
            nn.Linear(shape.width, 4 * shape.width), nn.GELU(), nn.Linear(4 * shape.width, shape.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, time, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        # Right padding + causal attention: real tokens never attend to padding, so no padding mask is needed.
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape, vocab_size: int, max_len: int):
        super().__init__()
        self.shape = shape
        self.token_embedding = nn.Embedding(vocab_size, shape.width)
        self.position_embedding = nn.Embedding(max_len, shape.width)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: fewer parameters, learns faster when small
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: small weights keep the first logits near uniform (loss ~ ln(vocab)).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, attention_mask=None, labels=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
        return CausalLMOutput(loss=loss, logits=logits)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N + 12 x layers x width x seq_len (the PaLM appendix formula), where N is
        every parameter but the position embedding, a lookup with no matmul; the token embedding counts once,
        as the tied output projection it also is. gpt2-small at seq_len 1024, vocabulary 256: N = 85.3M."""
        embedding = self.position_embedding.weight.numel()
        params = sum(p.numel() for p in self.parameters()) - embedding
        return 6 * params + 12 * self.shape.layers * self.shape.width * seq_len


def build_model(config, vocab_size: int) -> nn.Module:
    check_model_spec(config.model)
    if config.model.startswith(BUILTIN_PREFIX):
        return GPT(BUILTIN_MODELS[config.model[len(BUILTIN_PREFIX) :]], vocab_size, config.seq_len)
    model = load_factory(config.model, "model")(config, vocab_size)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model factory {config.model!r} returned {type(model).__name__}, not a torch nn.Module")
    return model


def with_sync_batchnorm(model: nn.Module, config, world_size: int) -> nn.Module:
    """The model with SyncBatchNorm for each BatchNorm where --sync-batchnorm asks and there are peers to share the
    batch statistics with: one process has none, and SyncBatchNorm would only add its collectives."""
    if config.sync_batchnorm and world_size > 1:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def loss_of(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    loss = output["loss"] if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None:
        raise ConfigError("the model's forward returned no loss; return a tensor or an object with .loss")
    return loss


def estimate_flops_per_token(model: nn.Module, seq_len: int) -> float:
    if hasattr(model, "flops_per_token"):
        return float(model.flops_per_token(seq_len))
    return 6.0 * sum(p.numel() for p in model.parameters())
