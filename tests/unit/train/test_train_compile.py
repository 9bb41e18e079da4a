"""Issue 13: --compile with bucketed padding, recompile counting, the CUDA defaults; CPU stand-ins for the GPU path
(the GPU tests at the bottom run where a CUDA GPU is)."""

from __future__ import annotations

import argparse
import shutil
from functools import partial

import pytest
import torch

from tests.helpers.compile import tiny_gpt
from trainstack.commands.cli import main
from trainstack.telemetry.compiles import CompileWatch
from trainstack.telemetry.device import peak_flops
from trainstack.train.rank import config as train_config
from trainstack.train.rank.config import TrainConfig, missing_compiler
from trainstack.train.rank.data import ArithmeticSequences, collate, load_token_data
from trainstack.train.rank.performance import bucket_count, compile_in_place


def test_bucketed_padding_gives_the_same_loss_as_none():
    samples = [{"input_ids": [(3 * i + k) % 64 for k in range(length)]} for i, length in enumerate((17, 40, 70, 5))]
    plain, bucketed = collate(samples), collate(samples, pad_to_multiple_of=32, max_width=100)
    assert plain["input_ids"].shape[1] == 70 and bucketed["input_ids"].shape[1] == 96
    model = tiny_gpt(100).eval()
    with torch.no_grad():
        assert torch.allclose(model(**plain).loss, model(**bucketed).loss, atol=1e-6)


def test_buckets_bound_the_shapes_a_dataset_of_varied_lengths_takes():
    config = TrainConfig(seq_len=100, bucket_size=32)
    data = ArithmeticSequences(300, 64, 2, 100, seed=1)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=3,
        shuffle=True,
        collate_fn=partial(collate, pad_to_multiple_of=config.bucket_size, max_width=config.seq_len),
    )
    widths = {batch["input_ids"].shape[1] for batch in loader}
    assert widths <= {32, 64, 96, 100} and len(widths) > 1
    assert len(widths) <= bucket_count(config) == 4
    assert (
        len(
            {
                batch["input_ids"].shape[1]
                for batch in torch.utils.data.DataLoader(data, batch_size=3, collate_fn=collate)
            }
        )
        > 4
    )


def test_full_sequences_need_no_padding():
    data = load_token_data("builtin:full-sequences", "text", 48, 0.0, 1234, None)
    assert {len(data.train[i]["input_ids"]) for i in range(len(data.train))} == {48}


def test_compile_in_place_keeps_state_dict_keys_so_checkpoints_interchange(fresh_dynamo):
    compiled = tiny_gpt(32)
    compile_in_place(compiled, TrainConfig(compile=True, compile_backend="eager", seq_len=32))
    assert compiled._compiled_call_impl is not None
    eager = tiny_gpt(32)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in key for key in compiled.state_dict())
    eager.load_state_dict(compiled.state_dict(), strict=True)
    compiled.load_state_dict(eager.state_dict(), strict=True)


def test_compile_watch_counts_recompiles_and_warns_once_past_the_buckets(fresh_dynamo):
    config = TrainConfig(compile=True, compile_backend="eager", seq_len=64, bucket_size=32)
    model = tiny_gpt(64)
    compile_in_place(model, config)
    warnings = []
    watch = CompileWatch(bucket_count(config), warn=warnings.append)
    try:
        steps = []
        for width in (32, 32, 64, 48, 48):  # 48 is no bucket: a shape the buckets do not cover
            ids = torch.randint(0, 64, (2, width))
            model(input_ids=ids, labels=ids).loss.backward()
            steps.append(watch.step_done())
        assert [step is not None for step in steps] == [True, False, True, True, False]
        assert [step[1] for step in steps if step] == [0, 1, 1]
        assert (watch.compiles, watch.recompiles) == (3, 2) and watch.seconds > 0
        assert len(warnings) == 1 and "2 recompiles exceed the 2 length buckets" in warnings[0]
    finally:
        watch.close()


def test_what_an_evaluation_compiles_is_its_own_not_the_next_steps_nor_a_recompile(fresh_dynamo):
    config = TrainConfig(compile=True, compile_backend="eager", seq_len=32)
    model = tiny_gpt(32)
    compile_in_place(model, config)
    watch = CompileWatch(buckets=1, warn=pytest.fail)
    ids = torch.randint(0, 64, (2, 32))
    try:
        model(input_ids=ids, labels=ids).loss.backward()
        assert watch.step_done() is not None and watch.recompiles == 0
        model.eval()
        with torch.no_grad():  # the evaluation's graph: compiled again, in the pause
            model(input_ids=ids, labels=ids)
        model.train()
        assert watch.compiles > watch.per_shape, "the evaluation compiled nothing: the test tests nothing"
        watch.resync()
        model(input_ids=ids, labels=ids).loss.backward()
        assert watch.step_done() is None  # the step after it compiled nothing
        assert watch.recompiles == 0 and watch.in_pauses == watch.compiles - watch.per_shape
    finally:
        watch.close()


def test_compile_is_refused_in_one_line_without_a_compiler(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code = main(["train", "--exporter-port", "0", "--output-dir", str(tmp_path / "run"), "--compile"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("trainstack train: error: --compile needs a C++ compiler")
    assert not (tmp_path / "run").exists()
    assert missing_compiler(TrainConfig(compile=True, compile_backend="aot_eager"), on_cuda=False) is None


def test_cuda_defaults_fill_only_what_the_configuration_leaves_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    parser = argparse.ArgumentParser()
    train_config.add_arguments(parser)
    on_gpu = train_config.from_sources(parser.parse_args(["--batch-size", "8"]), on_cuda=True)
    assert (on_gpu.model, on_gpu.dataset, on_gpu.seq_len, on_gpu.mixed_precision, on_gpu.batch_size) == (
        "builtin:gpt2-small",
        "builtin:full-sequences",
        1024,
        "bf16",
        8,
    )
    on_cpu = train_config.from_sources(parser.parse_args([]), on_cuda=False)
    assert on_cpu == TrainConfig()
    assert (on_cpu.model, on_cpu.seq_len, on_cpu.batch_size, on_cpu.mixed_precision) == (
        "builtin:tiny-gpt",
        128,
        16,
        "no",
    )


def test_mfu_peak_of_fp32_runs_is_the_tf32_peak_when_tf32_is_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda")
    assert peak_flops(cuda, "no", tf32=True) == 494.7e12
    assert peak_flops(cuda, "no", tf32=False) == 66.9e12
    assert peak_flops(cuda, "bf16", tf32=True) == 989.4e12
