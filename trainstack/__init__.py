"""trainstack's contracts: what train/ and monitoring/ share (the CLI, errors, the run directory, metrics)."""
