"""The automatic instrumentation's pure parts (trainstack/auto/): the command's environment, which process is a
rank, and what a forward pass's inputs say."""

import os
import sys
import types

import pytest
import torch

from trainstack.auto import BOOTSTRAP_DIR, instrument, instrumented_environment
from trainstack.auto.instrument import GROUP_AGAIN, SAFETENSORS, SECOND_MODEL, Rank, imported, inputs_of, is_rank


def test_the_start_up_hook_goes_first_on_the_pythonpath_before_the_commands_own():
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert instrumented_environment({"A": "1"}) == {"A": "1", "PYTHONPATH": str(BOOTSTRAP_DIR)}
    chained = instrumented_environment({"PYTHONPATH": f"/mine{os.pathsep}/theirs"})["PYTHONPATH"]
    assert chained == os.pathsep.join([str(BOOTSTRAP_DIR), "/mine", "/theirs"])


@pytest.mark.parametrize(
    ("argv0", "env", "rank"),
    [
        ("train.py", {}, True),  # a plain single process
        ("train.py", {"RANK": "1", "WORLD_SIZE": "2"}, True),  # torchrun's, accelerate's, Lightning's ranks
        ("/venv/bin/torchrun", {}, False),  # the launcher's agent
        ("/venv/lib/torch/distributed/run.py", {}, False),  # python -m torch.distributed.run
        ("/venv/bin/accelerate", {}, False),
        ("-c", {}, False),  # python -c: no script
    ],
)
def test_a_rank_is_told_from_its_environment_and_program(monkeypatch, argv0, env, rank):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [argv0])
    assert is_rank() is rank


def test_samples_and_tokens_come_from_the_inputs_shapes():
    assert inputs_of((torch.zeros(8, 3),), {}) == (8, 0)  # features: samples, no tokens
    assert inputs_of((), {"input_ids": torch.zeros(4, 16, dtype=torch.long)}) == (4, 64)
    assert inputs_of(("text", torch.tensor(1.0)), {}) == (0, 0)  # nothing with a batch dimension


def test_a_failing_hook_turns_the_rank_off_with_one_line_once(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    rank = Rank()

    def fails() -> None:
        raise ValueError("odd input")

    rank.guarded(fails)
    rank.guarded(fails)
    assert rank.off
    assert capsys.readouterr().err == (
        "trainstack watch: rank 3: automatic instrumentation off (ValueError: odd input); the run goes on unmeasured\n"
    )


def test_what_the_instrumentation_leaves_out_is_said_once_and_it_goes_on(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    rank = Rank()
    for _ in range(3):  # a second model made each epoch, say: one line
        rank.notice(SECOND_MODEL)
    rank.notice(GROUP_AGAIN)
    assert rank.active and not rank.off
    assert capsys.readouterr().err == (
        f"trainstack watch: rank 1: {SECOND_MODEL}\ntrainstack watch: rank 1: {GROUP_AGAIN}\n"
    )


def test_a_framework_trainer_is_left_to_its_callback(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setitem(sys.modules, "lightning.pytorch", types.ModuleType("lightning.pytorch"))
    rank = Rank()
    rank.guarded(rank.started)
    assert rank.off and rank.monitor is None
    assert capsys.readouterr().err == (
        "trainstack watch: rank 0: automatic instrumentation off (a Lightning Trainer runs here: add trainstack's "
        "Lightning callback to it (docs/monitor-your-training.md)); the run goes on unmeasured\n"
    )


def test_a_process_without_a_rank_is_named_by_its_pid(capsys, monkeypatch):
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    Rank().turn_off(ValueError("odd"))
    assert capsys.readouterr().err.startswith(f"trainstack watch: process {os.getpid()}: automatic instrumentation off")


def test_a_process_forked_from_the_rank_runs_none_of_its_hooks():
    """A DataLoader worker forked from the rank holds a copy of its state, monitor included; the fork tells it
    (os.register_at_fork runs `in_a_forked_child` there)."""
    rank = Rank()
    ran = []
    rank.guarded(lambda: ran.append(True))
    assert ran == [True]
    rank.in_a_forked_child()
    rank.guarded(lambda: ran.append(True))
    assert ran == [True] and not rank.off


class _Pauses:
    """A monitor that only keeps its pauses."""

    def __init__(self):
        self.calls: list[str] = []

    def pause_started(self, part: str) -> None:
        self.calls.append(f"+{part}")

    def pause_ended(self, part: str) -> None:
        self.calls.append(f"-{part}")


def test_switching_the_model_or_the_module_ddp_wraps_to_eval_mode_is_an_evaluation():
    """A loop that evaluates on one rank calls `model.module` itself: no forward of the model, only its switch of
    mode, shows it."""
    rank, inner = Rank(), torch.nn.Linear(2, 2)
    rank.model = torch.nn.Sequential()
    rank.model.module = inner  # where DDP keeps the module it wraps
    assert rank.switches_mode(rank.model) and rank.switches_mode(inner)
    assert not rank.switches_mode(torch.nn.Linear(2, 2))  # another module (a teacher, a metric's) is not the model
    rank.monitor = pauses = _Pauses()
    rank.mode_switched(False)
    rank.mode_switched(False)  # the wrapper's eval() switches its module too: one evaluation
    assert pauses.calls == ["+evaluation"]
    rank.mode_switched(True)
    rank.mode_switched(True)
    assert pauses.calls == ["+evaluation", "-evaluation"]


def test_a_model_written_by_safetensors_is_a_checkpoint_pause(monkeypatch, tmp_path):
    """Accelerate's save_state and transformers' save_pretrained write the model with safetensors.torch's save_file
    (its save_model calls it too): a pause where the rank's monitor trains, the same write without one."""
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", safetensors.torch.save_file)  # put back after the test
    imported(SAFETENSORS, safetensors.torch)
    rank = Rank()
    monkeypatch.setattr(instrument, "RANK", rank)
    model = torch.nn.Linear(2, 2)
    safetensors.torch.save_model(model, str(tmp_path / "unmonitored.safetensors"))  # a worker's, or before training
    rank.monitor = pauses = _Pauses()
    safetensors.torch.save_model(model, str(tmp_path / "model.safetensors"))
    assert pauses.calls == ["+checkpoint_save", "-checkpoint_save"] and rank.pause is None
    loaded = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(loaded["weight"], model.weight) and (tmp_path / "unmonitored.safetensors").is_file()


class _Steps:
    """A monitor that only keeps what each step says of compiling."""

    def __init__(self):
        self.compiled: list[tuple[bool, int]] = []

    def step(self, samples: int, *, compile_seconds: float | None, recompiles: int, **figures) -> None:
        self.compiled.append((compile_seconds is not None, recompiles))


def test_a_step_during_which_the_script_compiled_is_compile_time(fresh_dynamo, monkeypatch):
    """From the rank's monitor's start, what torch.compile compiles makes its step compile time (as --compile's
    under `trainstack train`); a new input shape compiles again, a recompile."""
    import trainstack.monitor

    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # a process alone trains whenever it steps
    monkeypatch.setattr(instrument, "FRAMEWORKS", {})  # whatever other tests imported
    monkeypatch.setattr(trainstack.monitor, "start", lambda model: monitor)
    rank, monitor = Rank(), _Steps()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    double = torch.compile(lambda x: x * 2, backend="eager")
    rank.started()  # at the loop's first training event: its first fetch, before the first forward compiles
    try:
        for size in (2, 2, 3, 3):
            double(torch.ones(size))
            rank.stepped(optimizer, (), {})
    finally:
        rank.compiles.close()  # its callback off: the tests after this one compile too
    assert monitor.compiled == [(True, 0), (False, 0), (True, 1), (False, 0)]
