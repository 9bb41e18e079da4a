"""`--strategy fsdp`: FSDP2 (`fully_shard`) through Accelerate's FSDP plugin, on GPUs and on CPU ranks alike.

Accelerate shards the model per unit (the built-in models' transformer `Block`, a factory's `--fsdp-wrap` classes
or its `_no_split_modules`), keeps tied weights together in the root unit, and saves and loads sharded state
with torch.distributed.checkpoint, so no rank ever holds the whole model's state.

Accelerate 1.15 turns its FSDP plugin on only for accelerator devices: on CPU ranks (MULTI_CPU over gloo) it
silently keeps plain DDP. `fully_shard` itself runs over gloo, so `enable_on_cpu_ranks` completes the switch that
Accelerate's state leaves out; everything after it (prepare, backward, clipping, save_state/load_state) is
Accelerate's own FSDP2 code, the same code a GPU run takes. Telemetry times the units' all-gathers and
reduce-scatters through FSDP2's public hooks (trainstack/telemetry/fsdp_comm.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.dataclasses import get_module_class_from_name
from torch import nn

from trainstack.errors import ConfigError
from trainstack.train.rank.config import TrainConfig
from trainstack.train.rank.model import Block
from trainstack.train.rank.specs import BUILTIN_PREFIX

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

BUILTIN_UNITS = [Block.__name__]
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def plugin_for(config: TrainConfig) -> FullyShardedDataParallelPlugin | None:
    """The FSDP2 plugin for --strategy fsdp, every setting pinned: `accelerate launch --use_fsdp` exports FSDP_*
    defaults, and one of them (cpu_ram_efficient_loading) would move the model to the meta device and untie the
    built-in models' shared embedding and head weights."""
    if config.strategy != "fsdp":
        return None
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=True,  # free each unit's gathered parameters after its forward: the memory saving
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=None,  # chosen in set_units, once the model exists
        state_dict_type="SHARDED_STATE_DICT",  # each rank saves and loads its own shards (DCP)
        mixed_precision_policy=_mixed_precision_policy(config.mixed_precision),
        cpu_offload=False,
        cpu_ram_efficient_loading=False,
        activation_checkpointing=False,
    )


def _mixed_precision_policy(mixed_precision: str) -> MixedPrecisionPolicy | None:
    """Low-precision parameters and compute, fp32 gradient reduction: summing many ranks' bf16 gradients loses
    the small ones. The sharded master weights and the optimizer state stay fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy  # here: a DDP rank never pays for importing FSDP

    dtype = COMPUTE_DTYPES.get(mixed_precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else None


def enable_on_cpu_ranks(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """Finish what AcceleratorState does for GPU ranks (state.py: distributed type MULTI_GPU -> FSDP) for gloo
    CPU ranks, which it leaves as MULTI_CPU. Accelerate's FSDP2 code paths only test this type."""
    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState.__init__ ends


def require_fsdp(accelerator: Accelerator) -> None:
    """Never train as DDP when FSDP was asked for."""
    if not accelerator.is_fsdp2:
        raise ConfigError(
            f"--strategy fsdp needs ranks started by `trainstack train` or `accelerate launch --use_fsdp` (this "
            f"process runs as {str(accelerator.distributed_type).split('.')[-1]}, without a process group)"
        )


def unit_classes(config: TrainConfig, model: nn.Module) -> list[str]:
    """The module classes that become FSDP units; each must occur in the model."""
    names = config.fsdp_wrap_classes
    if not names:
        names = (
            BUILTIN_UNITS
            if config.model.startswith(BUILTIN_PREFIX)
            else list(getattr(model, "_no_split_modules", None) or [])
        )
    missing = [name for name in names if get_module_class_from_name(model, name) is None]
    if missing:
        present = sorted({type(module).__name__ for module in model.modules()})
        raise ConfigError(
            f"--fsdp-wrap {','.join(missing)}: no such module class in {config.model}; it has {', '.join(present)}"
        )
    return names


def set_units(accelerator: Accelerator, config: TrainConfig, model: nn.Module) -> None:
    names = unit_classes(config, model)
    if not names:
        accelerator.print(
            f"trainstack: warning: {config.model} names no unit to shard (no --fsdp-wrap, no "
            "_no_split_modules): the whole model is one FSDP unit, gathered in full for each forward"
        )
    accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = names
