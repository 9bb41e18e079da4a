"""`python -m trainstack`: the same as the `trainstack` command (tests and benchmarks run it so)."""

import sys

from trainstack.commands.cli import main

sys.exit(main())
