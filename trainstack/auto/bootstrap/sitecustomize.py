"""trainstack watch's start-up hook in every Python process of the watched command (docs/monitor-your-training.md).

`trainstack watch` puts this folder first on the command's PYTHONPATH, so Python's `site` imports this file at
start-up in each of the command's Python processes: the launcher, torchrun's agent, DataLoader and compile workers,
and the ranks. It imports nothing but the standard library and never torch: it adds one finder to `sys.meta_path`
that notices torch's import, and only then (trainstack/auto/instrument.py) decides whether the process is a rank and
hooks it. A process that never imports torch pays for a dictionary look-up and this file's import.

It then runs the `sitecustomize` this one hid, if any (OpenTelemetry's `opentelemetry-instrument` does the same).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_HOOKED = (
    "torch",
    "safetensors.torch",
    "transformers.trainer",
    "lightning.pytorch.trainer.trainer",
    "pytorch_lightning.trainer.trainer",
)
"""torch (the instrumentation is installed once it is imported), safetensors' writer (its saves become checkpoint
pauses), and the framework Trainers that get trainstack's callback: each noticed here, wherever in the imports it
comes, since each may be what imports torch first."""


class _Imported:
    """A `sys.meta_path` finder that finds nothing itself: when a module of _HOOKED is imported, it wraps the loader
    the other finders give it, so trainstack's instrumentation sees the module once it has run; it leaves once all
    have come. (Duck-typed, not an importlib.abc.MetaPathFinder: importing importlib.abc costs every process
    milliseconds.)"""

    def __init__(self):
        self.waiting = set(_HOOKED)

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        if not self.waiting:
            sys.meta_path.remove(self)
        others = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next(filter(None, (finder.find_spec(name, path, target) for finder in others)), None)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_instrument(module):
            exec_module(module)
            _instrument(name, module)

        spec.loader.exec_module = exec_then_instrument
        return spec


def _instrument(name, module):
    try:
        from trainstack.auto.instrument import imported

        imported(name, module)
    except Exception as error:  # the user's run never fails for its instrumentation
        print(f"trainstack watch: instrumentation off in process {os.getpid()}: {error!r}", file=sys.stderr)


def _chain_to_the_hidden_sitecustomize():
    """Imports the `sitecustomize` later on sys.path than this one (a virtual environment's, a distribution's); with
    none, this one stays imported under the name, as Python's import expects of the module it is running."""
    this = sys.modules.pop("sitecustomize")
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    saved, sys.path[:] = list(sys.path), others
    try:
        __import__("sitecustomize")
    except ModuleNotFoundError as error:
        if error.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this
    finally:
        sys.path[:] = saved


# Only as Python's start-up hook: imported by its package name (a test walking trainstack's modules), it is a module
# like any other and hooks nothing.
if __name__ == "sitecustomize":
    if os.environ.get("TRAINSTACK_RUN_DIR") and "torch" not in sys.modules:
        sys.meta_path.insert(0, _Imported())
    _chain_to_the_hidden_sitecustomize()
