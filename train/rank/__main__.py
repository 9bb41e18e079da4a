"""`python -m trainstack.train.rank`: one rank. Accelerate (or torchrun) starts one of these per device."""

import argparse
import os
import sys

from trainstack.errors import EXIT_CONFIG, ConfigError
from trainstack.heap import imports_uncollected
from trainstack.lease_lock import hold_for_life
from trainstack.rundir import LEASE_FILE_ENV
from trainstack.train.rank.config import add_arguments, from_sources
from trainstack.train.rank.stopping import StopRequested


def main(argv: list[str] | None = None) -> int:
    stop = StopRequested()
    if LEASE_FILE_ENV in os.environ:
        hold_for_life(os.environ[LEASE_FILE_ENV])
    parser = argparse.ArgumentParser(prog="python -m trainstack.train.rank", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = from_sources(args)
    except ConfigError as error:
        print(f"trainstack rank: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    with imports_uncollected():
        from trainstack.train.rank.trainer import Trainer  # after validation: a config typo answers before torch loads

    return Trainer(config, stop).run()


if __name__ == "__main__":
    sys.exit(main())
