"""CPU ranks forked from the agent once it has imported what a rank imports, rather than each started afresh.

A rank's start-up is its imports: torch, `torch._dynamo` (every optimizer's constructor imports it), Accelerate and
`datasets` (Accelerate's prepare_data_loader imports it), about 6 s of CPU per rank on a CPU host, paid again by each
rank of each launch, and on CPU ranks it is the training's own CPU. torchrun can run the ranks as a function of its
own interpreter, started by the start method it is given (its --run-path and --start-method); Accelerate's launcher
passes neither, so the agent wraps the torchrun function that turns its arguments into a launch config. A rank
forked this way then looks, to itself and its peers, like one torchrun started:
- in a session of its own, as torchrun starts its subprocesses: a signal to the launcher's process group is not the
  ranks' (they stop in order, saving a checkpoint: trainstack/lifetime.py);
- with Python's own signal handlers, not torchrun's, which the agent holds while it forks;
- writing its output a line at a time, as `python -u` does;
- running `python -m trainstack.train.rank` as its __main__, a child of the agent as before.

GPU ranks are started afresh: Accelerate's launcher may have initialised CUDA in the agent, and a process forked from
one that has cannot use CUDA.
"""

from __future__ import annotations

import ctypes
import io
import os
import runpy
import signal
import sys

from trainstack.heap import imports_uncollected

__all__ = ["fork_cpu_ranks"]

RANK_PROCESS_NAME = b"trainstack-rank"  # what `top` and `ps -o comm` show: the agent's is torchrun's "pt_elastic"
PR_SET_NAME = 15


def fork_cpu_ranks() -> None:
    """From now on in this process, torchrun forks its ranks, once it has imported a rank's modules."""
    import torch.distributed.run as torchrun

    config_from_args = torchrun.config_from_args

    def forking_config(args):
        config, command, command_args = config_from_args(args)
        if command != sys.executable or command_args[:2] != ["-u", "-m"]:
            return config, command, command_args  # not `python -u -m module`: started as torchrun would
        with imports_uncollected():
            import datasets  # noqa: F401  (Accelerate's prepare_data_loader imports it when installed)
            import torch._dynamo  # noqa: F401  (the optimizer's constructor imports it)

            from trainstack.train.rank import trainer  # noqa: F401
        config.start_method = "fork"
        return config, run_module_as_rank, command_args[2:]

    torchrun.config_from_args = forking_config


def run_module_as_rank(module: str, *argv: str) -> None:
    """`python -u -m module *argv` in a rank forked from the agent."""
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=True)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, RANK_PROCESS_NAME, 0, 0, 0)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
