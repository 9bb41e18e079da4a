"""The loader's and DDP's throughput options of the config as the arguments torch and Accelerate take them: the
DataLoader's keyword arguments, Accelerate's DistributedDataParallelKwargs, and DDP's compression hook. One place,
so docs/training.md's table of `trainstack tune`'s options and a user's own DataLoader(...) and DDP(...) arguments
reads off it."""

from __future__ import annotations

from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

from trainstack.train.rank.config import TrainConfig


def loader_options(config: TrainConfig, on_gpu: bool) -> dict:
    """DataLoader(...)'s worker and memory arguments. torch refuses a prefetch factor and persistent workers
    without workers, and pinning helps only a copy to a GPU."""
    workers = config.num_workers > 0
    return dict(
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor if workers else None,
        persistent_workers=config.persistent_workers and workers,
        pin_memory=config.pin_memory and on_gpu,
    )


def ddp_kwargs(config: TrainConfig) -> DistributedDataParallelKwargs:
    """DDP(...)'s arguments through Accelerate, which registers --ddp-comm-hook's compression hook (DDP's own
    fp16 or bf16 one) on the model; the rank's monitor times the all-reduce without a hook of its own."""
    return DistributedDataParallelKwargs(
        find_unused_parameters=config.find_unused_parameters,
        bucket_cap_mb=config.ddp_bucket_cap_mb,
        static_graph=config.ddp_static_graph,
        comm_hook=DDPCommunicationHookType.NO
        if config.ddp_comm_hook == "none"
        else DDPCommunicationHookType(config.ddp_comm_hook),
    )
