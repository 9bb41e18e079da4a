"""The launcher's own parts, once per node: the world and the flags of `trainstack train` (launch_config.py), the
agent it starts, and the commands beside it (doctor, export, bench scaling). Nothing here runs inside a rank;
`trainstack train` itself composes these with the supervisor (commands/train.py)."""
