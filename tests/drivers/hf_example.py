"""examples/hf_trainer.py, as the tests run it: loaded from its file (examples/ is no package), and as a rank under
torchrun whose collator slows down on cue, so that the ranks come to wait for their input.

    torchrun ... -m tests.drivers.hf_example --slow-down-when PATH --delay SECONDS [the example's own flags]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-down-when", type=Path, required=True, help="once this file exists, batches are slow")
    parser.add_argument("--delay", type=float, required=True, help="seconds each slow batch takes longer to make")
    options, example_args = parser.parse_known_args()
    example = load_example()
    collate = example.collate

    def collate_slowing_down(samples):
        if options.slow_down_when.exists():
            time.sleep(options.delay)
        return collate(samples)

    example.collate = collate_slowing_down  # what build_trainer hands the Trainer
    example.main(example_args)


if __name__ == "__main__":
    main()
