"""trainstack.monitor, the public loop API, on one CPU process: what it records and when, and that outside a
watched run it does nothing. Under `trainstack watch` with 2 ranks it is tested in tests/process/test_user_loop.py, and
trainstack's own loop (which uses it) in every tests/process/test_train_*.py run."""

from __future__ import annotations

import inspect
import json
import time

import pytest
import torch

import trainstack.monitor
from tests.helpers.fakes import FakeDdpModel
from trainstack.monitor import Monitor, NullMonitor, TrainingMonitor
from trainstack.rundir import DEFAULT_LOG_EVERY, LOG_EVERY_ENV, RUN_DIR_ENV, RunDir


def public_methods(cls) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


def records(run_dir) -> list[dict]:
    path = RunDir(run_dir).rank_records(0)
    return [line for line in map(json.loads, path.read_text().splitlines()) if "time" in line]


def test_the_null_monitor_has_every_method_of_the_monitor_with_its_parameters():
    assert public_methods(NullMonitor) == public_methods(Monitor) == public_methods(TrainingMonitor)
    assert not issubclass(Monitor, NullMonitor)  # siblings: a live monitor is typed as the protocol, not as a null one


def test_outside_a_watched_run_it_records_nothing_and_says_so_once(unwatched, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 1)
    first = trainstack.monitor.start(model)
    second = trainstack.monitor.start(model)
    assert isinstance(first, NullMonitor) and isinstance(second, NullMonitor)
    for batch in first.batches([torch.ones(2, 4)] * 3):
        with first.forward():
            loss = model(batch).sum()
        first.step(2, loss=loss)
    first.close()
    said = capsys.readouterr().err
    assert said.count("trainstack.monitor: not in a watched run") == 1 and RUN_DIR_ENV in said
    assert list(tmp_path.iterdir()) == []


def test_disabled_it_is_silent(unwatched, capsys, tmp_path):
    assert isinstance(trainstack.monitor.start(run_dir=tmp_path, enabled=False), NullMonitor)
    assert capsys.readouterr().err == ""


def test_disabled_it_still_registers_the_models_hook_untimed(unwatched, tmp_path):
    model, hook = FakeDdpModel(), lambda process_group, bucket: None
    assert isinstance(trainstack.monitor.start(model, run_dir=tmp_path, enabled=False, comm_hook=hook), NullMonitor)
    assert model.hooks == [(None, hook)]


def slow_batches(count: int, seconds: float):
    for _ in range(count):
        time.sleep(seconds)
        yield torch.ones(2, 4)


def test_a_plain_loop_records_steps_samples_tokens_loss_and_each_wait_for_a_batch(unwatched, tmp_path):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = trainstack.monitor.start(model, run_dir=tmp_path, log_every=5, optimizer=optimizer)
    assert isinstance(monitor, Monitor) and monitor.clock == "host"
    for batch in monitor.batches(slow_batches(10, 0.02)):
        with monitor.forward():
            loss = model(batch).pow(2).mean() * 0 + 3.0  # a known loss, still a tensor with a graph
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(2, tokens=torch.tensor(8), loss=loss)
    monitor.close()
    lines = records(tmp_path)
    assert [line["step"] for line in lines] == [1, 5, 10]  # the first step, then every log_every
    assert sum(line["samples"] for line in lines) == 20 and sum(line["tokens"] for line in lines) == 80
    assert all(line["loss"] == pytest.approx(3.0) for line in lines)
    assert all(line["lr"] == 0.1 for line in lines)  # the optimizer's
    # Each of the 10 waits slept 20 ms before the loader answered (a lower bound, never an upper one).
    assert sum(line["data_wait_seconds"] for line in lines) >= 10 * 0.02
    assert lines[0]["param_bytes"] == 5 * 4  # measured once, after the optimizer's first step


def test_an_interval_is_recorded_one_interval_after_it_closes(unwatched, tmp_path):
    """So that on a GPU the device has long run it: reading it then never waits."""
    monitor = trainstack.monitor.start(run_dir=tmp_path, log_every=4)
    for _ in range(3):
        monitor.step(1, loss=1.0)
    assert records(tmp_path) == []  # step 1's interval closed at step 1; it is read when the next one closes
    monitor.step(1, loss=1.0)
    assert [line["step"] for line in records(tmp_path)] == [1]
    for _ in range(4):
        monitor.step(1, loss=1.0)
    assert [line["step"] for line in records(tmp_path)] == [1, 4]
    monitor.close()
    assert [line["step"] for line in records(tmp_path)] == [1, 4, 8]


def test_micro_batches_of_gradient_accumulation_join_the_step_that_follows(unwatched, tmp_path):
    monitor = trainstack.monitor.start(run_dir=tmp_path, log_every=1)
    monitor.micro_batch(tokens=5, loss=torch.tensor(1.0))
    monitor.step(4, tokens=torch.tensor(7), loss=torch.tensor(3.0))
    monitor.close()
    (line,) = records(tmp_path)
    assert (line["tokens"], line["loss"], line["samples"]) == (12, 2.0, 4)


def test_a_pause_is_no_step_and_a_resumed_run_numbers_its_steps_on(unwatched, tmp_path):
    monitor = trainstack.monitor.start(run_dir=tmp_path, log_every=2)
    monitor.resumed_at(40, epoch=3)
    monitor.step(1)
    with monitor.pause("evaluation"):
        time.sleep(0.5)
    monitor.step(1)
    monitor.close()
    lines = records(tmp_path)
    assert [(line["step"], line["epoch"], line["loss"], line["lr"]) for line in lines] == [(42, 3, None, None)]
    # the evaluation's 0.5 s is not in the step after it
    assert len(lines[0]["step_seconds"]) == 2 and max(lines[0]["step_seconds"]) < 0.5


def test_inside_a_pause_the_loops_shared_calls_record_nothing_as_training(unwatched, tmp_path):
    """An evaluation run through the training loop's own functions: no `if training:` around the monitor's calls."""
    model = torch.nn.Linear(4, 1)
    monitor = trainstack.monitor.start(model, run_dir=tmp_path, log_every=100)

    def run_batches(batches, tokens):  # shared by training and evaluation, as many loops are
        for batch in monitor.batches(batches):
            with monitor.forward():
                loss = model(batch).sum()
            monitor.micro_batch(tokens=1000, loss=1000.0)
            monitor.step(2, tokens=tokens, loss=loss.detach())

    run_batches([torch.ones(2, 4)] * 3, tokens=8)
    with monitor.pause("evaluation"):
        run_batches(slow_batches(3, 0.1), tokens=8)
    run_batches([torch.ones(2, 4)] * 2, tokens=8)
    monitor.close()
    lines = records(tmp_path)
    assert lines[-1]["step"] == 5 and monitor.steps == 5  # the evaluation's 3 steps are no steps
    assert sum(line["samples"] for line in lines) == 10
    assert sum(line["tokens"] for line in lines) == 5 * 8 + 5 * 1000  # the training micro-batches only
    # The evaluation's 0.3 s of slow batches is its pause, not data wait and not step time.
    assert sum(line["data_wait_seconds"] for line in lines) < 0.3
    assert sum(len(line["step_seconds"]) for line in lines) == 5
    (evaluation,) = [pause for line in lines for pause in line["paused"] if pause["part"] == "evaluation"]
    assert evaluation["seconds"] >= 0.3


class DoubledAcrossRanks:
    """A loop's `interval_totals`: the sums reduced as if another rank had sent the same, each closing kept."""

    device = torch.device("cpu")

    def __init__(self):
        self.closed = []

    def reduce(self, tensor, reduction):
        return tensor * 2

    def __call__(self, sums):
        totals = sums.start_reduce(self, stop_requested=False)
        self.closed.append(totals)
        return totals


def test_a_loop_reads_the_monitors_sums_reduced_while_the_records_keep_the_ranks_own(unwatched, tmp_path):
    """One sum per interval, the monitor's: the loop (trainstack's Trainer) closes it with its cross-rank reduction."""
    reduction = DoubledAcrossRanks()
    monitor = trainstack.monitor.start(run_dir=tmp_path, log_every=4, interval_totals=reduction)
    monitor.micro_batch(tokens=5, loss=torch.tensor(1.0))
    monitor.step(4, tokens=torch.tensor(7), loss=torch.tensor(3.0))  # step 1 ends an interval
    monitor.step(4, tokens=3, loss=4.0)
    monitor.step(4, tokens=3, loss=4.0)  # steps 2-3: flushed at the close
    assert len(reduction.closed) == 1
    monitor.close()
    totals = [pending.result() for pending in reduction.closed]
    assert [(t.loss, t.tokens, t.local_loss, t.local_tokens, t.micro_batches) for t in totals] == [
        (2.0, 24, 2.0, 12, 2),
        (4.0, 12, 4.0, 6, 2),
    ]
    assert [(line["step"], line["loss"], line["tokens"]) for line in records(tmp_path)] == [(1, 2.0, 12), (3, 4.0, 6)]


def test_a_null_monitor_sums_only_for_a_loop_that_reads_the_totals(unwatched):
    reduction = DoubledAcrossRanks()
    monitor = trainstack.monitor.start(run_dir=None, log_every=2, interval_totals=reduction)
    assert type(monitor) is NullMonitor
    monitor.resumed_at(1)
    for _ in range(3):
        monitor.step(4, tokens=3, loss=4.0)  # steps 2-4: an interval ends at 2 and at 4
    monitor.micro_batch(tokens=1, loss=1.0)
    monitor.flush()
    assert monitor.steps == 4
    assert [(t.loss, t.tokens, t.micro_batches) for t in (p.result() for p in reduction.closed)] == [
        (4.0, 6, 1),
        (4.0, 12, 2),
        (1.0, 2, 1),
    ]
    idle = trainstack.monitor.start(run_dir=None)
    idle.step(4, tokens=torch.tensor(3), loss=torch.tensor(4.0))
    idle.flush()
    assert idle._sums.micro_batches == 0  # nothing is summed that nobody reads


def test_a_bad_log_interval_is_named(unwatched, monkeypatch):
    with pytest.raises(ValueError, match="log_every must be at least 1"):
        trainstack.monitor.start(run_dir="x", log_every=0)
    monkeypatch.setenv(LOG_EVERY_ENV, "ten")
    with pytest.raises(ValueError, match=f"^{LOG_EVERY_ENV}='ten' is not a number of steps; unset it or give"):
        trainstack.monitor.start(run_dir="x")


def test_the_interval_is_watchs_log_every_unless_the_script_gives_its_own(unwatched, monkeypatch):
    assert trainstack.monitor.start(run_dir=None)._log_every == DEFAULT_LOG_EVERY
    monkeypatch.setenv(LOG_EVERY_ENV, "3")  # `trainstack watch --log-every 3`
    assert trainstack.monitor.start(run_dir=None)._log_every == 3
    assert trainstack.monitor.start(run_dir=None, log_every=7)._log_every == 7


def test_unwatched_no_pause_name_stops_the_loop(unwatched, tmp_path, monkeypatch):
    # the same loop runs watched and not: unwatched, its instrumentation records nothing and refuses nothing
    monkeypatch.chdir(tmp_path)
    monitor = trainstack.monitor.start(run_dir=None)
    assert type(monitor) is NullMonitor
    monitor.pause_started("lunch")
    monitor.close()
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_pause_is_named(unwatched, tmp_path):
    monitor = trainstack.monitor.start(run_dir=tmp_path)
    with pytest.raises(ValueError, match="no pause 'lunch': a pause is one of evaluation, checkpoint_save"):
        monitor.pause_started("lunch")
    monitor.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the device-side sums")
def test_on_a_gpu_the_sums_stay_on_the_device_and_no_step_waits(unwatched, tmp_path):
    device = torch.device("cuda")
    monitor = trainstack.monitor.start(torch.nn.Linear(4, 1).to(device), run_dir=tmp_path, log_every=1)
    busy = torch.ones(4096, 4096, device=device)
    for _ in range(50):
        busy = busy @ busy / 4096
    monitor.step(1, tokens=busy[0, 0].long() * 3, loss=busy[0, 0] * 2)
    monitor.step(1, tokens=3, loss=2.0)
    queued_ahead = not torch.cuda.current_stream(device).query()
    monitor.close()
    assert queued_ahead  # two steps' bookkeeping did not drain the stream
    assert [(line["tokens"], line["loss"]) for line in records(tmp_path)] == [(3, 2.0), (3, 2.0)]
