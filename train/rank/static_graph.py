"""DDP's static graph reduces no gradient of a model output it cannot look into: each rank then steps with its own
gradients and the ranks train apart, with no error. Checked once per launch, after its first step.

With static_graph, DDP queues the gradient all-reduce through the output's tensors, which it finds by flattening
the output as a pytree: a tensor, a tuple, a list, a dict, transformers' ModelOutput and registered dataclasses
flatten; a plain dataclass or any other object does not. Without the static graph DDP reduces anyway, so only the
static graph needs the check. Two ranks that reduced the same gradients from the same weights step to the same
weights, bit for bit: one all-gather of a checksum says whether they did.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from trainstack.errors import ConfigError


def weights_checksum(model: torch.nn.Module) -> torch.Tensor:
    return torch.stack([parameter.detach().double().sum() for parameter in model.parameters()]).sum()


def require_reduced_gradients(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Raises ConfigError when the ranks' weights differ after a step under --ddp-static-graph."""
    checksums = accelerator.gather(weights_checksum(model).reshape(1))
    if torch.equal(checksums, checksums[:1].expand_as(checksums)):
        return
    raise ConfigError(
        "the ranks' weights differ after the first step under --ddp-static-graph: DDP reduced no gradient, "
        "because it cannot look into the type the model's forward returns; return a tensor, a tuple, a dict or "
        "transformers' ModelOutput, register the dataclass with torch.export.register_dataclass, or drop "
        "--ddp-static-graph"
    )
