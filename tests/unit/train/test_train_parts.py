"""The Trainer's parts on their own (trainstack/telemetry/compiles.py NoCompileWatch, schedule.py, step.py, evaluation.py,
outcome.py), with a stand-in accelerator where one is needed: one process, no process group. The 2-rank tests
(test_train_*.py) run them together in the real Trainer."""

from __future__ import annotations

import inspect
import json
import math
from types import SimpleNamespace

import pytest
import torch

from tests.factories import BatchNormLM
from trainstack.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from trainstack.rundir import METRICS_DIR_ENV, SUMMARY_VERSION, write_summary
from trainstack.telemetry.compiles import CompileWatch, NoCompileWatch
from trainstack.telemetry.interval import IntervalSums
from trainstack.train.rank.config import TrainConfig
from trainstack.train.rank.data import IGNORE_INDEX, collate, load_token_data
from trainstack.train.rank.evaluation import mean_loss
from trainstack.train.rank.loader_and_ddp import loader_options
from trainstack.train.rank.outcome import EXIT_CODES, Failure, explain_runtime_error, summary
from trainstack.train.rank.progress import Progress
from trainstack.train.rank.schedule import lr_factor, lr_scheduler
from trainstack.train.rank.step import nonfinite_weights


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_options_are_ones_torch_takes_with_and_without_workers(workers):
    config = TrainConfig(num_workers=workers, prefetch_factor=2, persistent_workers=True, pin_memory=True)
    loader = torch.utils.data.DataLoader(list(range(8)), **loader_options(config, on_gpu=False))
    # torch refuses a prefetch factor or persistent workers without workers; a CPU rank has nothing to pin for
    assert (loader.prefetch_factor, loader.persistent_workers, loader.pin_memory) == (
        (2, True, False) if workers else (None, False, False)
    )


def test_no_compile_watch_answers_what_the_loop_and_the_summary_ask():
    watch = NoCompileWatch()
    for name in ("step_done", "resync", "close"):
        assert (
            inspect.signature(getattr(NoCompileWatch, name)).parameters.keys()
            == inspect.signature(getattr(CompileWatch, name)).parameters.keys()
        ), name
    assert isinstance(CompileWatch.recompiles, property)
    assert watch.step_done() is None  # no step compiled: the loop records a plain step
    assert (watch.seconds, watch.recompiles) == (None, None)  # summary.json: null without --compile


@pytest.mark.parametrize("schedule, middle, end", [("cosine", 0.5, 0.0), ("linear", 0.5, 0.0), ("constant", 1.0, 1.0)])
def test_lr_factor_warms_up_linearly_then_decays(schedule, middle, end):
    factor = {
        step: lr_factor(step, warmup_steps=10, total_steps=110, schedule=schedule)
        for step in (0, 4, 9, 10, 60, 110, 500)
    }
    assert (factor[0], factor[4], factor[9]) == (0.1, 0.5, 1.0)
    assert factor[10] == 1.0
    assert math.isclose(factor[60], middle, abs_tol=1e-12)
    assert math.isclose(factor[110], end, abs_tol=1e-12) and factor[500] == factor[110]


def test_a_resumed_schedule_follows_this_launchs_total_steps():
    """A checkpoint's scheduler state must not bring back the old --max-steps: raising it trains on the new
    schedule. LambdaLR saves an empty dict for the schedule, as it did for the Trainer's bound method."""
    model = torch.nn.Linear(2, 2)
    config = TrainConfig(warmup_steps=0, lr_schedule="linear")
    saved = lr_scheduler(torch.optim.AdamW(model.parameters()), config, total_steps=100).state_dict()
    assert saved["lr_lambdas"] == [{}]
    resumed = lr_scheduler(torch.optim.AdamW(model.parameters()), config, total_steps=200)
    resumed.load_state_dict(saved)
    assert resumed.lr_lambdas[0](100) == 0.5


class SumAccelerator:
    """One process standing in for all: its reduction and gather return what they get."""

    device = torch.device("cpu")

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        return tensor

    def gather_for_metrics(self, tensor):
        return tensor


def test_interval_sums_reduce_to_the_mean_loss_and_start_over():
    sums = IntervalSums(torch.device("cpu"))
    batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    sums.add(torch.tensor(2.0), batch["attention_mask"].sum())
    sums.add(torch.tensor(4.0, dtype=torch.bfloat16), batch["attention_mask"].sum())
    totals = sums.start_reduce(SumAccelerator(), stop_requested=True).result()
    assert (totals.loss, totals.tokens, totals.local_tokens, totals.micro_batches, totals.stop) == (3.0, 8, 8, 2, True)
    assert totals.local_loss == 3.0
    assert sums.start_reduce(SumAccelerator(), stop_requested=False).result().micro_batches == 0


class TwoRanksAccelerator(SumAccelerator):
    """Another rank that sent the same sums: the reduction doubles them."""

    def reduce(self, tensor, reduction):
        return super().reduce(tensor, reduction) * 2


def test_interval_sums_keep_this_ranks_loss_and_tokens_apart_from_the_reduced_ones():
    sums = IntervalSums(torch.device("cpu"))
    sums.add(torch.tensor(2.0), collate([{"input_ids": [1, 2, 3]}])["attention_mask"].sum())
    totals = sums.start_reduce(TwoRanksAccelerator(), stop_requested=False).result()
    assert (totals.loss, totals.tokens, totals.local_tokens, totals.micro_batches, totals.stop) == (2.0, 6, 3, 1, False)
    sums.add(torch.tensor(1.0), 2)
    sums.add(torch.tensor(5.0), 2)
    sums.add(None, 1)  # a micro-batch that gave no loss: the means leave it out
    totals = sums.start_reduce(TwoRanksAccelerator(), stop_requested=False).result()
    assert (totals.loss, totals.tokens, totals.local_loss, totals.local_tokens) == (3.0, 10, 3.0, 5)


class FixedLogits(torch.nn.Module):
    def __init__(self, vocab: int, with_logits: bool):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        self.with_logits = with_logits

    def forward(self, input_ids, attention_mask, labels):
        logits = self.table(input_ids)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX
        )
        return SimpleNamespace(logits=logits, loss=loss) if self.with_logits else {"loss": loss}


@pytest.mark.parametrize("spec", ["builtin:sequences", "tests.factories:indexed_37"])
def test_an_eval_fraction_of_0_evaluates_nothing_whatever_the_data(spec):
    """The built-in data's evaluation set is its own, not a share held out; 0 still leaves it out (tune's trials)."""
    held_out = load_token_data(spec, "text", 32, 0.05, 1234, TrainConfig())
    none = load_token_data(spec, "text", 32, 0.0, 1234, TrainConfig())
    assert len(held_out.eval) > 0 and len(none.eval) == 0
    assert len(none.train) >= len(held_out.train)  # a factory's share goes back to training; the built-in's was apart


def test_evaluation_counts_every_real_token_once_and_no_padding():
    torch.manual_seed(0)
    model = FixedLogits(8, with_logits=True)
    batches = [collate([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6, 7]}]), collate([{"input_ids": [3, 1]}])]
    logits = [model.table(batch["input_ids"]) for batch in batches]
    expected = (
        torch.cat(
            [
                torch.nn.functional.cross_entropy(
                    lg[:, :-1].transpose(1, 2), b["labels"][:, 1:], ignore_index=IGNORE_INDEX, reduction="none"
                )[b["labels"][:, 1:] != IGNORE_INDEX]
                for lg, b in zip(logits, batches, strict=True)
            ]
        )
        .mean()
        .item()
    )
    assert math.isclose(mean_loss(SumAccelerator(), model, batches), expected, rel_tol=1e-6)
    assert model.training  # evaluation hands the model back in training mode


def test_evaluation_without_logits_weighs_each_batch_by_its_tokens():
    model = FixedLogits(8, with_logits=False)
    batches = [collate([{"input_ids": [1, 2, 3, 4, 5]}]), collate([{"input_ids": [6, 7]}])]
    with torch.no_grad():
        losses = [model(**batch)["loss"].item() for batch in batches]
    assert math.isclose(mean_loss(SumAccelerator(), model, batches), (4 * losses[0] + 1 * losses[1]) / 5, rel_tol=1e-6)


def test_the_exit_code_comes_with_the_explanation_not_from_its_words(monkeypatch):
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    config = TrainConfig(collective_timeout=5)
    unused = explain_runtime_error(
        RuntimeError("Expected to have finished reduction ... find_unused_parameters"), config
    )
    assert unused.exit_code == EXIT_CONFIG and "--find-unused-parameters" in unused.message
    grad = explain_runtime_error(RuntimeError("parameter 3 did not receive grad for rank 0"), config)
    assert grad.exit_code == EXIT_CONFIG
    hung = explain_runtime_error(RuntimeError("[gloo] Timed out waiting 5000ms for recv"), config)
    assert hung == Failure("a collective waited longer than --collective-timeout 5 s for a peer rank", EXIT_FAILED)
    assert explain_runtime_error(RuntimeError("shape mismatch"), config) is None
    assert EXIT_CODES == {"completed": EXIT_OK, "preempted": EXIT_PREEMPTED}


def test_summary_says_null_for_compile_figures_without_compile(tmp_path):
    accelerator = SimpleNamespace(
        num_processes=2, distributed_type="DistributedType.MULTI_CPU", device=torch.device("cpu")
    )
    progress = Progress(step=7, epoch=1, batch_in_epoch=3, initial_loss=4.0, last_loss=1.0)
    fields = summary(
        accelerator,
        TrainConfig(),
        progress,
        run_id="r1",
        started=0.0,
        throughput={},
        compile_watch=NoCompileWatch(),
        segments=[],
        exit_reason="completed",
        exit_code=EXIT_OK,
        eval_loss=None,
        error=None,
    )
    assert (fields["compile_seconds"], fields["recompiles"]) == (None, None)
    assert (fields["distributed_type"], fields["steps"], fields["epochs"]) == ("MULTI_CPU", 7, 2)
    path = tmp_path / "summary.json"
    write_summary(path, fields)
    assert json.loads(path.read_text()) == {"version": SUMMARY_VERSION, **fields}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_interval_totals_on_a_gpu_are_queued_without_waiting_for_it():
    """On a GPU, start_reduce returns while the interval's work still runs; result() waits for it and is exact."""
    device = torch.device("cuda")
    sums = IntervalSums(device)
    batch = {"attention_mask": torch.ones(2, 3, dtype=torch.long, device=device)}
    # A first interval, as a loop's first: CUDA loads each kernel on its first launch, and that waits for the device.
    sums.add(torch.ones(2, 2, device=device)[0, 0] * 3, batch["attention_mask"].sum())
    sums.start_reduce(SumAccelerator(), stop_requested=False).result()
    busy = torch.ones(4096, 4096, device=device)
    for _ in range(50):  # a few hundred milliseconds of queued work before the loss
        busy = busy @ busy / 4096
    sums.add(busy[0, 0] * 3, batch["attention_mask"].sum())
    pending = sums.start_reduce(SumAccelerator(), stop_requested=False)
    queued_ahead = not torch.cuda.current_stream(device).query()
    totals = pending.result()
    assert queued_ahead  # start_reduce did not drain the stream
    assert (totals.loss, totals.tokens, totals.local_tokens, totals.micro_batches) == (3.0, 6, 6, 1)


def test_sync_batchnorm_replaces_every_batchnorm_where_asked_and_there_are_peers():
    from trainstack.train.rank.model import with_sync_batchnorm

    def norms(sync: bool, world_size: int) -> set[type]:
        config = SimpleNamespace(sync_batchnorm=sync)
        model = with_sync_batchnorm(BatchNormLM(16), config, world_size)
        return {type(m) for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}

    assert norms(True, 2) == {torch.nn.SyncBatchNorm}
    assert norms(True, 1) == norms(False, 2) == {torch.nn.BatchNorm1d}  # one process: nothing to sync with


def test_nonfinite_weights_counts_each_parameter_holding_an_inf_or_nan_as_the_ranks_sum_them():
    summed = []
    accelerator = SimpleNamespace(device=torch.device("cpu"), reduce=lambda t, reduction: summed.append(reduction) or t)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    assert nonfinite_weights(accelerator, model) == 0
    with torch.no_grad():
        model[0].weight[1, 2] = math.inf
        model[1].bias[0] = math.nan
    assert nonfinite_weights(accelerator, model) == 2 and summed == ["sum", "sum"]
