"""The instrumentation of a rank that runs under `trainstack watch` with no trainstack line: torch's public hooks
drive the loop API (trainstack/monitor.py), as a loop's own calls would; a transformers or Lightning Trainer gets
trainstack's callback for it (trainstack/integrations/) when it is built, unless the script gave it one.

Installed by the start-up hook (bootstrap/sitecustomize.py) once the process has imported torch. In a rank it finds:

- the DDP model when the script wraps it (`DistributedDataParallel.__init__`), or the root FSDP2 module (the last
  that `fully_shard` took): its forward passes are timed, and its communication (the Monitor's `watch`);
- each wait for a batch: a DataLoader iterator's `__next__` while the model trains;
- each optimizer step (`register_optimizer_step_post_hook`), with the samples and tokens of the forward passes
  before it: the micro-batches of gradient accumulation are the forwards that did not step;
- evaluation (the model, or the module DDP wraps, switched to eval mode, or a forward pass in eval mode or without
  grad, until it trains again) and checkpoint saves
  (`torch.save`, `torch.distributed.checkpoint.save`, safetensors' `save_file` under Accelerate's `save_state` and
  transformers' `save_pretrained`) as pauses;
- the learning rate, from the stepping optimizer's first param group;
- what torch.compile compiles: a step that compiled is compile time, not step time.

It reads only shapes (never a device tensor's value), so it adds no host sync. The monitor starts at the first of
these that happens while the model trains, not at the wrap: a script that then calls `trainstack.monitor.start`
itself (or runs a trainstack callback, which does) is left to its own lines. The communication timing takes no DDP
communication hook, so a script's own keeps working, and is timed.

Whatever it cannot handle turns it off for the rank with one line on stderr; the user's code always runs as it would
without it (every hook's own work is guarded, the user's function is called outside the guard).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import dataloader

from trainstack.telemetry.collectives import wrap_collectives
from trainstack.telemetry.compiles import CompileWatch, NoCompileWatch

FAIL_ENV = "TRAINSTACK_AUTO_FAIL"
"""Makes the instrumentation fail on purpose (any value), at the rank's first optimizer step: the test that a
failing instrumentation costs the run one line and nothing else."""
LAUNCHERS = ("torchrun", "accelerate", os.path.join("torch", "distributed", "run.py"))
"""How sys.argv[0] ends in the launchers that start ranks and train nothing themselves."""
EVALUATION, CHECKPOINT_SAVE = "evaluation", "checkpoint_save"
DISTRIBUTED_CHECKPOINT, FSDP = "torch.distributed.checkpoint", "torch.distributed.fsdp"
SAFETENSORS = "safetensors.torch"
"""Whose `save_file` (which its `save_model` calls) writes the model of Accelerate's `save_state` and of
transformers' `save_pretrained`. Noticed by the start-up hook, not by _Imports: it imports torch itself, so a
script's `import safetensors.torch` above its `import torch`, as isort orders them, imports it first."""


def is_rank() -> bool:
    """A rank: a process a launcher started with its rank (torchrun, accelerate and Lightning set RANK or
    LOCAL_RANK), a plain `python script.py` of its own, or a multiprocessing child that joined a process group (the
    ranks of `torch.multiprocessing.spawn`, as PyTorch's DDP tutorial starts them, set no RANK: they pass theirs to
    init_process_group); never another multiprocessing child (DataLoader and compile workers join no group), nor a
    launcher's agent. Asked at the process's first training event, by when a rank has joined its group."""
    if multiprocessing.parent_process() is not None:
        return dist.is_available() and dist.is_initialized()
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return True
    program = sys.argv[0] if sys.argv else ""
    return program not in ("-c", "") and not program.endswith(LAUNCHERS)


FRAMEWORKS = {
    "lightning.pytorch": "Lightning",
    "pytorch_lightning": "Lightning",
    "transformers.trainer": "transformers",
}
"""Trainers whose loops the generic hooks are not checked against: there the rank's callback is the way (added by
itself to a transformers or Lightning Trainer, `lightning.pytorch`'s or `pytorch_lightning`'s; one that escaped it
is left alone)."""


class FrameworkTrainer(Exception):
    """The rank trains through a framework's Trainer: the generic layer stands down for it, saying so."""


class NotARank(Exception):
    """The process trains (an optimizer steps, a loader is read) but is no rank: it is left alone, silently."""


class Rank:
    """One rank's automatic instrumentation: what it found and the monitor it drives."""

    def __init__(self) -> None:
        self.active = True
        """False once the rank's hooks do nothing: it was turned off, its script records by its own lines (or it is
        no rank), or it is a process forked from the rank. One attribute, as every hook of every step reads it."""
        self.off = False
        self.model: torch.nn.Module | None = None
        """The model the steps train: the DDP wrapper, or the root FSDP2 module (the last that `fully_shard` took)."""
        self.optimizer: Any = None  # the first optimizer that steps: its steps are the rank's
        self.monitor: Any = None
        self.compiles: CompileWatch | NoCompileWatch = NoCompileWatch()
        """What torch.compile compiles from the monitor's start: a step that compiled is compile time."""
        self.pause: str | None = None
        self.in_forward = False
        self.samples = 0
        self.tokens = 0
        self.closed = False
        self.failing_on_purpose = bool(os.environ.get(FAIL_ENV))
        self.importing_the_monitor = False
        self.noticed: set[str] = set()

    # ---- saying so --------------------------------------------------------------------------------------------
    def turn_off(self, error: BaseException) -> None:
        """One line, once; every hook does nothing from now on."""
        if not self.off:
            self.off, self.active = True, False
            why = str(error) if isinstance(error, FrameworkTrainer) else f"{type(error).__name__}: {error}"
            self._say(f"automatic instrumentation off ({why}); the run goes on unmeasured")

    def notice(self, line: str) -> None:
        """A line, once per rank, on what the instrumentation leaves out while it goes on measuring."""
        if line not in self.noticed:
            self.noticed.add(line)
            self._say(line)

    def _say(self, line: str) -> None:
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")  # Lightning's launcher sets LOCAL_RANK
        who = f"rank {rank}" if rank else f"process {os.getpid()}"
        # One write of the whole line: the ranks share watch's stderr, and two ranks' lines must not interleave
        sys.stderr.write(f"trainstack watch: {who}: {line}\n")
        sys.stderr.flush()

    def in_a_forked_child(self) -> None:
        """Run by the fork itself (os.register_at_fork, below), in a process forked from the rank (a DataLoader
        worker): the monitor it holds a copy of is not its own. Asking os.getpid() at every hook would be a system
        call, five or more a step."""
        self.active = False

    def left_to_the_script(self) -> None:
        """The script records by its own lines (trainstack.monitor, a trainstack callback), or trains in no rank."""
        self.active = False

    def guarded(self, work: Callable[..., Any], *args: Any) -> Any:
        """`work(*args)`, or None once inactive or where it failed (which turns the rank off)."""
        if not self.active:
            return None
        try:
            return work(*args)
        except NotARank:
            return None
        except Exception as error:
            self.turn_off(error)
            return None

    # ---- the monitor --------------------------------------------------------------------------------------------
    def started(self) -> Any:
        """The rank's monitor, started at its first training event."""
        if self.monitor is None:
            if not is_rank():
                self.left_to_the_script()  # not a rank: nothing here trains, nothing to say
                raise NotARank
            framework = next((name for module, name in FRAMEWORKS.items() if module in sys.modules), None)
            if framework:
                raise FrameworkTrainer(
                    f"a {framework} Trainer runs here: add trainstack's {framework} callback to it "
                    "(docs/monitor-your-training.md)"
                )
            self.importing_the_monitor = True
            import trainstack.monitor

            self.compiles = CompileWatch()
            self.monitor = trainstack.monitor.start(self.model)
        return self.monitor

    def training(self) -> bool:
        """Whether the loop trains now: a model that is known, or a process alone, and no evaluation under way."""
        if self.model is not None:
            return self.model.training
        return int(os.environ.get("WORLD_SIZE", "1")) == 1

    def close(self) -> None:
        if self.monitor is not None and not self.closed:
            self.closed = True
            if self.pause is not None:
                self.pause_over()
            self.compiles.close()
            self.monitor.close()

    # ---- the hooks' work ----------------------------------------------------------------------------------------
    def forward_started(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        model = self.model
        if model is None or module is not model:
            return
        if not (model.training and torch.is_grad_enabled()):
            self.evaluating()
            return
        monitor = self.monitor or self.started()
        if self.pause is EVALUATION:
            self.evaluation_over()
        samples, tokens = inputs_of(args, kwargs)
        self.samples += samples
        self.tokens += tokens
        self.in_forward = True
        monitor.forward_started()

    def evaluating(self) -> None:
        """The loop evaluates (a forward pass or a fetch in eval mode, or a forward without grad): a pause, once the
        monitor has started (before its first step there is no step time to keep it out of)."""
        if self.pause is None and self.monitor is not None:
            self.monitor.pause_started(EVALUATION)
            self.pause = EVALUATION

    def switches_mode(self, module: torch.nn.Module) -> bool:
        """Whether `module.train()` switches the rank's model: the model itself, or the module DDP wraps (asked for
        each module of a tree at each switch, so a dict lookup, not nn.Module's attribute lookup)."""
        model = self.model
        return model is not None and (module is model or model._modules.get("module") is module)

    def mode_switched(self, training: bool) -> None:
        """The model (or the module DDP wraps) switched modes: eval mode starts an evaluation, train mode ends it. An
        evaluation that calls the wrapped module itself (`model.module`, as a loop that evaluates on one rank does)
        runs no forward through the model's hooks."""
        if training:
            self.evaluation_over()
        else:
            self.evaluating()

    def evaluation_over(self) -> None:
        """An evaluation (eval mode or no grad) lasts until the loop trains, switches its model to train mode,
        fetches a training batch or saves."""
        if self.pause == EVALUATION:
            self.pause_over()

    def pause_over(self) -> None:
        """The pause under way ends: the next step's time, and whether it compiled, count from here."""
        part, self.pause = self.pause, None
        self.monitor.pause_ended(part)
        self.compiles.resync()

    def data_wait_started(self) -> bool:
        """Whether this fetch is a training batch's (timed): the model trains, and no checkpoint is being saved."""
        if self.pause is CHECKPOINT_SAVE:
            return False
        if not self.training():
            self.evaluating()  # an evaluation's first batch: its wait is the evaluation's, not a step's
            return False
        monitor = self.monitor or self.started()
        if self.pause is EVALUATION:
            self.evaluation_over()
        monitor.data_wait_started()
        return True

    def batch_ready(self) -> None:
        self.monitor.data_ready()

    def forward_done(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self.in_forward:
            self.in_forward = False
            self.monitor.forward_done()

    def stepped(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        """torch's optimizer step post-hook."""
        if self.failing_on_purpose:
            raise RuntimeError(f"failing on purpose ({FAIL_ENV} is set)")
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is not self.optimizer or self.pause is not None or not self.training():
            return
        lr = optimizer.param_groups[0].get("lr")
        monitor = self.monitor or self.started()
        compile_seconds, recompiles = self.compiles.step_done() or (None, 0)
        monitor.step(
            self.samples,
            tokens=self.tokens or None,
            lr=lr if isinstance(lr, (float, int)) else None,  # a tensor's value would sync
            compile_seconds=compile_seconds,
            recompiles=recompiles,
        )
        self.samples = self.tokens = 0


RANK = Rank()
os.register_at_fork(after_in_child=RANK.in_a_forked_child)


class _Imports(importlib.abc.MetaPathFinder):
    """Notices three imports, then leaves `sys.meta_path`: trainstack.monitor by the script (or a trainstack callback
    it uses), whose lines then instrument the rank while the automatic layer stands down; once they have run,
    torch.distributed.checkpoint, whose `save` becomes a checkpoint pause, and torch.distributed.fsdp, whose
    `fully_shard` tells the model."""

    def __init__(self) -> None:
        self.waiting = {"trainstack.monitor", DISTRIBUTED_CHECKPOINT, FSDP}

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        if not self.waiting:
            sys.meta_path.remove(self)
        if name == "trainstack.monitor":
            if not RANK.importing_the_monitor:
                RANK.left_to_the_script()
            return None
        others = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next(filter(None, (finder.find_spec(name, path, target) for finder in others)), None)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_hook(module) -> None:
            exec_module(module)
            if name == FSDP:
                module.fully_shard = _sharding(module.fully_shard)
            else:
                module.save = _as_pause(module.save, CHECKPOINT_SAVE)

        spec.loader.exec_module = exec_then_hook
        return spec


def inputs_of(args: tuple, kwargs: dict) -> tuple[int, int]:
    """The samples and tokens of a forward pass, from its inputs' shapes: the first tensor's first dimension; its
    elements are tokens where it holds integers (input ids) of two dimensions or more."""
    first = _first_tensor(args)
    if first is None:
        first = _first_tensor(kwargs.values())
    if first is None or first.dim() == 0:
        return 0, 0
    tokens = first.numel() if first.dim() >= 2 and not first.is_floating_point() else 0
    return int(first.shape[0]), tokens


def _first_tensor(values) -> torch.Tensor | None:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    return None


def imported(name: str, module: Any) -> None:
    """The start-up hook saw `module` imported: torch, safetensors.torch, or a framework's Trainer module."""
    if name == "torch":
        install()
    elif name == SAFETENSORS:  # a pause only where a monitor trains: in a worker, a call of the function as it was
        module.save_file = _as_pause(module.save_file, CHECKPOINT_SAVE)
    elif multiprocessing.parent_process() is None:
        trainer = module.Trainer
        trainer.__init__ = _with_callback(trainer.__init__, name)


def _with_callback(init: Callable, framework_module: str) -> Callable:
    """A Trainer's __init__ that adds trainstack's callback for the framework, unless the script gave one: the
    callback then records the rank (its import of trainstack.monitor stands the generic layer down)."""

    @functools.wraps(init)
    def init_with_callback(self, *args, **kwargs):
        init(self, *args, **kwargs)
        RANK.guarded(lambda: _add_callback(self, framework_module))

    return init_with_callback


def _add_callback(trainer: Any, framework_module: str) -> None:
    if not is_rank():
        return
    if framework_module.startswith(("lightning", "pytorch_lightning")):
        from trainstack.integrations.lightning_hooks import LightningHooks

        if not any(isinstance(callback, LightningHooks) for callback in trainer.callbacks):
            trainer.callbacks.insert(0, _lightning_callback(framework_module)())
        return
    from trainstack.integrations.hf import TrainstackCallback as HFCallback

    if not any(isinstance(callback, HFCallback) for callback in trainer.callback_handler.callbacks):
        trainer.add_callback(HFCallback(trainer))


def _lightning_callback(framework_module: str) -> type:
    """trainstack's callback for the package the Trainer comes from: each accepts only its own Callback."""
    if framework_module.startswith("pytorch_lightning"):
        from trainstack.integrations.pytorch_lightning import TrainstackCallback
    else:
        from trainstack.integrations.lightning import TrainstackCallback
    return TrainstackCallback


def install() -> None:
    """Hooks this process, unless it is a forked multiprocessing child (a DataLoader or compile worker; a spawned
    child, mp.spawn's ranks among them, imports torch before it knows its parent). Whether it is a rank is decided
    at its first training event (is_rank), when sys.argv names the script (while `python -m` imports its module's
    package, torch among them, it does not yet): a launcher's agent never has one, so it never imports the
    monitor."""
    if multiprocessing.parent_process() is not None:
        return
    if "trainstack.monitor" in sys.modules:  # being imported by the script, which then records by its own lines
        RANK.left_to_the_script()
        return
    sys.meta_path.insert(0, _Imports())
    _wrap_ddp()
    _wrap_data_loader()
    _wrap_module_train()
    register_optimizer_step_post_hook(functools.partial(RANK.guarded, RANK.stepped))
    torch.save = _as_pause(torch.save, CHECKPOINT_SAVE)
    if dist.is_available():
        dist.destroy_process_group = _closing_first(dist.destroy_process_group)
        dist.init_process_group = _said_again(dist.init_process_group)
        wrap_collectives()
    atexit.register(RANK.guarded, RANK.close)


def _wrap_ddp() -> None:
    init = DistributedDataParallel.__init__

    @functools.wraps(init)
    def wrapped_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        RANK.guarded(lambda: _found(self))

    DistributedDataParallel.__init__ = wrapped_init


SECOND_MODEL = (
    "a second DistributedDataParallel model: only the first one's training is measured (right for a teacher or an "
    "EMA copy; a second training in this process goes unmeasured)"
)
GROUP_AGAIN = (
    "a process group started again after the first was destroyed: what trains after it goes unmeasured (one "
    "training a process; docs/monitor-your-training.md)"
)


def _found(model: DistributedDataParallel) -> None:
    if RANK.model is not None:  # not the one the steps train
        if model is not RANK.model:
            RANK.notice(SECOND_MODEL)
        return
    RANK.model = model
    _time_forward(model)


def _time_forward(model: torch.nn.Module) -> None:
    """The model's forward passes, timed while it is the rank's model; first among its pre-hooks, so the waits for
    collectives in the others (DDP's buffer broadcast, FSDP's all-gathers) are inside."""
    model.register_forward_pre_hook(
        functools.partial(RANK.guarded, RANK.forward_started), prepend=True, with_kwargs=True
    )
    model.register_forward_hook(functools.partial(RANK.guarded, RANK.forward_done))


def _sharding(fully_shard: Callable) -> Callable:
    """FSDP2's `fully_shard`, telling the model: the root module is sharded last, after its layers."""

    @functools.wraps(fully_shard)
    def sharding(module, *args, **kwargs):
        sharded = fully_shard(module, *args, **kwargs)

        def found() -> None:
            if RANK.monitor is None and not isinstance(RANK.model, DistributedDataParallel):
                RANK.model = sharded
                _time_forward(sharded)

        RANK.guarded(found)
        return sharded

    return sharding


def _wrap_data_loader() -> None:
    next_batch = dataloader._BaseDataLoaderIter.__next__

    @functools.wraps(next_batch)
    def timed_next(self):
        if not RANK.active:
            return next_batch(self)
        timed = RANK.guarded(RANK.data_wait_started)
        try:
            return next_batch(self)
        finally:
            if timed:
                RANK.guarded(RANK.batch_ready)

    dataloader._BaseDataLoaderIter.__next__ = timed_next


def _wrap_module_train() -> None:
    """Every module's `train` (which `eval` calls), telling the rank of a switch of its model's mode once it knows
    its model."""
    module_train = torch.nn.Module.train

    @functools.wraps(module_train)
    def switching_train(self, mode: bool = True):
        switched = module_train(self, mode)
        if RANK.active and RANK.switches_mode(self):
            RANK.guarded(RANK.mode_switched, mode)
        return switched

    torch.nn.Module.train = switching_train


def _as_pause(save: Callable, part: str) -> Callable:
    """`save` timed as the pause `part`, when a started monitor trains (no pause open)."""

    @functools.wraps(save)
    def paused_save(*args, **kwargs):
        paused = False

        def begin() -> None:
            nonlocal paused
            if RANK.monitor is not None and RANK.pause in (None, EVALUATION):
                RANK.evaluation_over()
                RANK.monitor.pause_started(part)
                RANK.pause, paused = part, True

        RANK.guarded(begin)
        try:
            return save(*args, **kwargs)
        finally:
            if paused:
                RANK.guarded(RANK.pause_over)

    return paused_save


def _said_again(init: Callable) -> Callable:
    """A process group started after the rank's monitor closed with the first (`_closing_first`) is said once, after
    it has started: a rank that joins late can make torch's re-initialisation hang."""

    @functools.wraps(init)
    def init_again(*args, **kwargs):
        started = init(*args, **kwargs)
        if RANK.closed:
            RANK.guarded(RANK.notice, GROUP_AGAIN)
        return started

    return init_again


def _closing_first(destroy: Callable) -> Callable:
    """The monitor's closing line before the process group goes: its collectives' callbacks must be let go first."""

    @functools.wraps(destroy)
    def closing_then_destroy(*args, **kwargs):
        RANK.guarded(RANK.close)
        return destroy(*args, **kwargs)

    return closing_then_destroy
