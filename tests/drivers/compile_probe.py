"""A rank that trains with `--compile`, then records how the model was wrapped and compiled.

Run under `accelerate launch`; writes PROBE_DIR/rank-<r>.json.
"""

import argparse
import json
import os
import sys

from torch._dynamo.eval_frame import OptimizedModule

from train.config import add_arguments, from_sources
from train.rank import Trainer


def main() -> int:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--probe-dir", required=True)
    args = parser.parse_args()
    trainer = Trainer(from_sources(args))
    code = trainer.run()
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
    with open(os.path.join(args.probe_dir, f"rank-{trainer.accelerator.process_index}.json"), "w") as out:
        json.dump(facts, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
