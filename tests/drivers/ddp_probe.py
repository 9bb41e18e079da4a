"""A rank that trains with trainstack's Trainer, then dumps what the tests compare across ranks.

Run under `accelerate launch`; writes PROBE_DIR/rank-<r>.pt (parameters, world facts, sample order per epoch).
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
        },
        os.path.join(probe_dir, f"rank-{accelerator.process_index}.pt"),
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
