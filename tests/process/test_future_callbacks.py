"""trainstack/telemetry/future_callbacks.py: a rank's telemetry closes only once the threads that completed the
collectives' futures have dropped its callbacks; a process that exits before then aborts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

EXIT_AFTER_THE_LOOP = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from trainstack.telemetry.future_callbacks import FutureCallbacks


    class LetGoWhileExiting:
        \"\"\"Cleared with the module's names, after the interpreter began its exit: the completing thread then
        tries to drop the callback, as gloo's thread does when the rank's exit outruns it.\"\"\"

        def __init__(self, gate, sleep):
            self.gate, self.sleep = gate, sleep

        def __del__(self):
            self.gate.set()
            self.sleep(1)


    callbacks, gate = FutureCallbacks(), threading.Event()
    parent = torch.futures.Future()
    child = callbacks.then(parent, lambda future: future.value())
    child.then(lambda future: gate.wait(30))
    threading.Thread(target=parent.set_result, args=(1,), daemon=True).start()
    child.wait()
    if sys.argv[1] == "close":
        gate.set()
        assert callbacks.wait_released(timeout=30)
    exiting = LetGoWhileExiting(gate, time.sleep)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["close", "exit"])
def test_a_process_exits_cleanly_only_once_the_callbacks_are_dropped(ending):
    done = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_THE_LOOP, ending], capture_output=True, text=True, timeout=120
    )
    if ending == "close":
        assert done.returncode == 0, done.stderr
    else:  # what a rank did before its telemetry waited: CPython ends the thread and the process dies of a signal,
        # SIGABRT from std::terminate as a rank did, or SIGSEGV where the thread touched the interpreter first
        assert done.returncode in (-6, -11), (done.returncode, done.stderr)
