"""The training config without a rank: config file and flags merge with flags winning, each validation message,
and docs/training.md lists every option (bad input to real runs: tests/process/test_train_inputs.py)."""

from __future__ import annotations

import re

import pytest

from trainstack.errors import ConfigError
from trainstack.train.rank.config import TrainConfig, read_config_file


def test_config_file_and_flags_merge_with_flags_winning(tmp_path):
    import argparse

    from trainstack.train.rank.config import add_arguments, from_sources

    toml = tmp_path / "c.toml"
    toml.write_text('batch_size = 4\nlr = 0.01\nmodel = "builtin:small-gpt"\n')
    assert read_config_file(str(toml)) == {"batch_size": 4, "lr": 0.01, "model": "builtin:small-gpt"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = from_sources(parser.parse_args(["--config", str(toml), "--batch-size", "8"]), on_cuda=False)
    assert (config.batch_size, config.lr, config.model) == (8, 0.01, "builtin:small-gpt")
    # what neither sets keeps the default
    assert config.num_workers == TrainConfig().num_workers


@pytest.mark.parametrize(
    "values, message",
    [
        ({"grad_accum": 0}, "--gradient-accumulation-steps must be at least 1"),
        ({"lr": 0.0}, "--learning-rate must be positive"),
        ({"lr": float("inf")}, "--learning-rate must be a finite number, got inf"),
        ({"weight_decay": float("nan")}, "--weight-decay must be a finite number, got nan"),
        ({"collective_timeout": float("nan")}, "--collective-timeout must be a finite number"),
        ({"max_grad_norm": -1.0}, "--max-grad-norm must be 0 or more"),
        ({"seed": -1}, "--seed must be 0 to 4294967295"),
        ({"seed": 2**64}, "--seed must be 0 to 4294967295"),
        ({"lr_schedule": "step"}, "--lr-schedule must be one of"),
        ({"mixed_precision": "fp8"}, "--mixed-precision must be one of"),
        ({"collective_timeout": -1.0}, "--collective-timeout must be positive"),
        ({"eval_fraction": 1.0}, "--eval-fraction must be in [0, 1)"),
        ({"lr": 1e39}, "--learning-rate must be positive and below 1e\\+30 (float32's range"),
        ({"sync_batchnorm": 1}, "sync_batchnorm must be bool"),
        ({"prefetch_factor": 0}, "--prefetch-factor must be at least 1"),
        ({"num_workers": 0, "prefetch_factor": 4}, "--prefetch-factor 4 needs --num-workers 1 or more"),
        ({"ddp_bucket_cap_mb": 0}, "--ddp-bucket-cap-mb must be at least 1"),
        ({"ddp_comm_hook": "powersgd"}, "--ddp-comm-hook must be one of none, fp16, bf16"),
        ({"strategy": "fsdp", "ddp_bucket_cap_mb": 100}, "--ddp-bucket-cap-mb is a DDP option"),
        ({"strategy": "fsdp", "ddp_comm_hook": "bf16"}, "--ddp-comm-hook is a DDP option"),
        ({"ddp_static_graph": True, "grad_accum": 2}, "--ddp-static-graph needs --gradient-accumulation-steps 1"),
        ({"keep_checkpoints": -1}, "--keep-checkpoints must be 0 or more"),
        ({"keep_checkpoints": 0}, "--checkpoint-every 100 saves checkpoints that --keep-checkpoints 0 keeps none of"),
    ],
)
def test_config_validation_messages(values, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**values)


def test_training_doc_lists_every_option():
    import dataclasses

    from tests.helpers.runs import REPO
    from trainstack.train.rank.config import _flag

    doc = (REPO / "docs" / "training.md").read_text()
    missing = [f.name for f in dataclasses.fields(TrainConfig) if f"`{_flag(f.name)}" not in doc]
    assert not missing, f"docs/training.md does not describe {missing}"


def test_a_key_given_twice_is_refused_not_the_last_taken(tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text("lr: 0.01\nbatch_size: 8\nlr: 0.001\n")
    with pytest.raises(ConfigError, match=r"twice.yaml is not valid YAML: key 'lr' is given twice"):
        read_config_file(str(config))


def test_a_config_that_is_a_folder_is_said_so(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; pass a .toml or .yaml file to --config"):
        read_config_file(str(tmp_path))


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("model: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml is not UTF-8 text \(byte 10\); save it as UTF-8"):
        read_config_file(str(config))


@pytest.mark.parametrize(
    "source, said",
    [
        ("def build(:\n", "SyntaxError: "),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("build = 3\n", "'build' in module 'broken_factory' is not a function"),
    ],
)
def test_a_factory_module_that_fails_as_it_loads_is_one_line(tmp_path, monkeypatch, source, said):
    from trainstack.train.rank.specs import load_factory

    (tmp_path / "broken_factory.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "broken_factory", raising=False)
    with pytest.raises(ConfigError) as raised:
        load_factory("broken_factory:build", "model")
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_factory_is_checked_from_its_source_without_running_it(tmp_path, monkeypatch):
    """The launcher's check: a model's module imports torch, seconds of CPU before a rank could start, so its
    function is found in its source (bound in a try block here). What only running it shows, here that it raises
    as it loads, each rank says in its line (load_factory, above)."""
    import sys

    from trainstack.train.rank.specs import check_factory

    (tmp_path / "unrun_factory.py").write_text(
        "raise RuntimeError('ran')\ntry:\n    from fast_models import build\nexcept ImportError:\n"
        "    def build(config, vocab_size):\n        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "unrun_factory", raising=False)
    check_factory("unrun_factory:build", "model")
    assert "unrun_factory" not in sys.modules


@pytest.mark.parametrize(
    "source, said",
    [
        ("globals()['build'] = lambda config, vocab_size: None\n", None),  # made as it runs: the import finds it
        ("def other(config, vocab_size):\n    return None\n", "module 'made_factory' has no function 'build'"),
        ("def build(:\n", "failed as it was imported: SyntaxError: "),
    ],
)
def test_a_factory_the_source_does_not_settle_is_imported(tmp_path, monkeypatch, source, said):
    import sys

    from trainstack.train.rank.specs import check_factory

    (tmp_path / "made_factory.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "made_factory", raising=False)
    if said is None:
        check_factory("made_factory:build", "model")
        assert "made_factory" in sys.modules
        return
    with pytest.raises(ConfigError) as raised:
        check_factory("made_factory:build", "model")
    assert said in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "returned, said",
    [
        ("[]", "returned 0 samples; training needs at least 2"),
        (
            "[{'text': 'a'}, {'text': 'b'}]",
            "each sample must be a mapping with 'input_ids' (a list of token ids); the first is ['text']",
        ),
        ("42", "returned a int, not a map-style dataset"),
    ],
)
def test_a_dataset_factory_that_returns_no_training_data_is_one_line(tmp_path, monkeypatch, returned, said):
    from trainstack.train.rank.data import load_token_data

    (tmp_path / "odd_datasets.py").write_text(f"def build(config):\n    return {returned}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "odd_datasets", raising=False)
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_token_data("odd_datasets:build", "text", 64, 0.1, 1234, None)


def test_a_flag_argparse_refuses_is_one_line_not_the_whole_usage(capsys):
    from trainstack.commands.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["train", "--max-steps", "x"])
    assert exited.value.code == 2
    said = "trainstack train: error: argument --max-steps: invalid int value: 'x'; see trainstack train --help\n"
    assert capsys.readouterr().err == said


def test_ctrl_c_before_a_commands_own_handler_is_an_interrupted_exit_not_a_traceback(capsys, monkeypatch):
    # Ctrl-C lands in the command's imports, before watch or train put their own SIGINT handler in place
    from trainstack.commands import cli

    def interrupted(name: str):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main(["watch", "--", "true"]) == 130  # as a shell reports a death by SIGINT
    assert capsys.readouterr().err == "\n"
