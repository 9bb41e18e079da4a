"""The commands that compose the rest, above everything they import: the `trainstack` command line (cli.py),
`trainstack train` (train.py: config, doctor, lease, the supervised ranks, report), `trainstack watch` (watch.py)
and `trainstack tune` (tune/). Nothing below imports them; `python -m trainstack` (trainstack/__main__.py) is the
one entry point that reaches up."""
