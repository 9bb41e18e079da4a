"""A rank that trains with trainstack's Trainer, then dumps what the tests compare across ranks.

Run under `accelerate launch`; writes PROBE_DIR/rank-<r>.pt (parameters, world facts, sample order per epoch, and the
options the DDP wrapper and the training loader were built with).
"""

import os
import sys

import torch

from tests.drivers import run_trainer_from_command_line


def main() -> int:
    trainer, code, probe_dir = run_trainer_from_command_line()
    accelerator = trainer.accelerator
    orders = {}
    for epoch in (0, 1):
        trainer.train_loader.set_epoch(epoch)
        orders[epoch] = [int(first) for batch in trainer.train_loader for first in batch["input_ids"][:, 0]]
    torch.save(
        {
            "exit_code": code,
            "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "parameters": {
                k: v.detach().clone() for k, v in accelerator.unwrap_model(trainer.model).state_dict().items()
            },
            "orders": orders,
            "ddp": {
                "bucket_bytes_cap": trainer.model.bucket_bytes_cap,
                "static_graph": trainer.model.static_graph,
                "comm_hooks": [hook.__name__ for hook, _ in trainer.model._comm_hooks],
            },
            "loader": {
                name: getattr(trainer.train_loader, name)
                for name in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
            },
        },
        os.path.join(probe_dir, f"rank-{accelerator.process_index}.pt"),
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
