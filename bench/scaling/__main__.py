"""`python -m bench.scaling [options]` from the repository root: the same as `trainstack bench scaling`."""

import argparse
import sys

from bench.scaling import cli
from trainstack.errors import EXIT_CONFIG, ConfigError

parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=cli.__doc__)
cli.add_options(parser)
arguments = parser.parse_args()
try:
    sys.exit(cli.run(arguments))
except ConfigError as error:
    print(f"bench scaling: error: {error}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)
