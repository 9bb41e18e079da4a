"""A rank that trains with `--compile`, then records how the model was wrapped and compiled.

Run under `accelerate launch`; writes PROBE_DIR/rank-<r>.json.
"""

import json
import os
import sys

from torch._dynamo.eval_frame import OptimizedModule

from tests.drivers import run_trainer_from_command_line


def main() -> int:
    trainer, code, probe_dir = run_trainer_from_command_line()
    wrapper = trainer.model
    inner = trainer.accelerator.unwrap_model(wrapper)
    facts = {
        "exit_code": code,
        "num_processes": trainer.accelerator.num_processes,
        "wrapper": type(wrapper).__name__,
        "wrapper_is_compiled": isinstance(wrapper, OptimizedModule) or wrapper._compiled_call_impl is not None,
        "inner_is_optimized_module": isinstance(inner, OptimizedModule),
        "inner_compiled_in_place": inner._compiled_call_impl is not None,
        "state_dict_keys": sorted(inner.state_dict()),
        "compiles": trainer.compile_watch.compiles,
        "recompiles": trainer.compile_watch.recompiles,
    }
    with open(os.path.join(probe_dir, f"rank-{trainer.accelerator.process_index}.json"), "w") as out:
        json.dump(facts, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
