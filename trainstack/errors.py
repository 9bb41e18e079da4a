"""The two exception types a command ends on, each printed as one line (never a traceback), and the exit codes.

`ConfigError`: the user's input is wrong (a flag, a file, a run directory in use, a failed preflight check);
retrying the same command cannot help. `RuntimeFailure`: the input is fine but something the command needs
failed (a network peer did not answer, a port could not be listened on, I/O failed); retrying may help once the
cause is gone. docs/training.md, "Exit codes", lists every code.
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2  # bad input or a failed preflight check: retrying cannot help (Kubernetes fails the Job at once)
EXIT_RUNTIME = 69  # sysexits' EX_UNAVAILABLE: a network, listen or I/O failure; retrying may help
EXIT_PREEMPTED = 75  # stopped by SIGTERM/SIGINT after saving a checkpoint (if the run keeps any): rerun to resume


class ConfigError(Exception):
    """Bad input. The message says what is wrong and how to fix it, in one line."""


class RuntimeFailure(Exception):
    """Something the command needs failed, not its input. The message says what failed and what to check, in
    one line."""


def exit_code(error: ConfigError | RuntimeFailure) -> int:
    return EXIT_RUNTIME if isinstance(error, RuntimeFailure) else EXIT_CONFIG
