"""The one exception type that means "the user's input is wrong": printed as one line, never as a traceback."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2  # bad input or a failed preflight check: retrying cannot help (Kubernetes fails the Job at once)
EXIT_PREEMPTED = 75  # stopped by SIGTERM/SIGINT after saving a checkpoint: rerun the same command to resume


class ConfigError(Exception):
    """Bad input. The message says what is wrong and how to fix it, in one line."""
