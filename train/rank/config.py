"""The training configuration: one dataclass, read from TOML/YAML plus command-line overrides, validated here.

The launcher and every rank build it the same way (`from_sources`), so a rank started by hand with
`accelerate launch -m trainstack.train.rank --config run/config.yaml` runs exactly what the launcher checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainstack.errors import ConfigError
from trainstack.rundir import SUMMARY_FILE

MIXED_PRECISION = ("no", "fp16", "bf16")
LR_SCHEDULES = ("cosine", "linear", "constant")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
# What a run on CUDA GPUs trains when the configuration leaves these out: a GPU-sized model on sequences that
# need no padding, in bf16 where the GPU has it. CPU runs keep the field defaults (a minute-long `make run`).
CUDA_DEFAULTS = {
    "model": "builtin:gpt2-small",
    "dataset": "builtin:full-sequences",
    "seq_len": 1024,
    "batch_size": 32,
    "mixed_precision": "bf16 (no on GPUs without bf16)",
}
STRATEGIES = ("ddp", "fsdp")
DDP_COMM_HOOKS = ("none", "fp16", "bf16")
DEFAULT_PREFETCH_FACTOR = 2  # torch's own with workers
MAX_LEARNING_RATE = 1e30


def _option(default: Any, help_text: str, flag: str | None = None, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help_text, "flag": flag, **extra})


@dataclass
class TrainConfig:
    """What to train and how. Every field is a config-file key and a `--kebab-case` flag."""

    output_dir: str = _option("runs/default", f"run directory: config, checkpoints, metrics, {SUMMARY_FILE}")
    max_steps: int = _option(300, "stop after this many optimizer steps (0: no step limit, use --epochs)")
    epochs: int = _option(0, "stop after this many passes over the data (0: no epoch limit, use --max-steps)")
    batch_size: int = _option(16, "samples per rank per micro-batch (global batch = this x ranks x grad-accum)")
    grad_accum: int = _option(1, "micro-batches per optimizer step", flag="--gradient-accumulation-steps")
    lr: float = _option(3e-3, "peak learning rate (AdamW)", flag="--learning-rate")
    lr_schedule: str = _option("cosine", "learning-rate decay after warm-up: cosine, linear or constant")
    warmup_steps: int = _option(20, "linear warm-up steps")
    weight_decay: float = _option(0.01, "AdamW weight decay")
    max_grad_norm: float = _option(1.0, "clip the gradient norm to this (0: no clipping)")
    mixed_precision: str = _option("no", "no, fp16 (CUDA only) or bf16")
    compile: bool = _option(
        False,
        "compile the model with torch.compile; batches are padded to --bucket-size "
        "multiples so that few shapes compile",
    )
    compile_backend: str = _option(
        "inductor",
        "torch.compile backend: inductor (generates kernels), or aot_eager "
        "and eager (no code generation: for debugging)",
    )
    bucket_size: int = _option(
        128,
        "with --compile, pad each batch's length up to a multiple of this (at most "
        "--seq-len): at most seq-len / bucket-size shapes compile",
    )
    fused_adamw: bool = _option(True, "fused AdamW kernel on CUDA (no effect on CPU)")
    tf32: bool = _option(True, "TF32 tensor cores for fp32 matmuls and convolutions on CUDA (no effect on CPU)")
    seed: int = _option(1234, "seed for weights, data order and dropout (same on every rank)")
    dataset: str = _option(
        "builtin:sequences",
        "builtin:sequences, a local file or folder (.txt/.json/.jsonl/.parquet/.csv), "
        "a module:function factory, or a Hugging Face Hub name (online only)",
    )
    text_field: str = _option("text", "column holding the text in a local or hub dataset")
    seq_len: int = _option(128, "longest sequence in tokens; longer samples are truncated")
    eval_fraction: float = _option(
        0.05, "share of a local/hub dataset held out for evaluation (0: no evaluation, the built-in data's too)"
    )
    eval_every: int = _option(0, "evaluate every N steps (0: only at the end)")
    model: str = _option("builtin:tiny-gpt", "builtin:tiny-gpt, builtin:small-gpt or a module:function factory")
    num_workers: int = _option(2, "data-loader worker processes per rank")
    prefetch_factor: int = _option(
        DEFAULT_PREFETCH_FACTOR,
        "batches each loader worker keeps ready ahead of the loop (needs --num-workers 1 or more)",
    )
    pin_memory: bool = _option(
        True, "page-locked host memory for batches, so their copy to the GPU overlaps compute (no effect on CPU)"
    )
    persistent_workers: bool = _option(
        True, "keep the loader workers between epochs instead of starting them again (no effect with 0 workers)"
    )
    checkpoint_every: int = _option(100, "save a checkpoint every N steps (0: only on SIGTERM and at the end)")
    keep_checkpoints: int = _option(
        3, "keep the newest N checkpoints (0: write none, for a throwaway run such as trainstack tune's trials)"
    )
    resume: str = _option("auto", "auto (latest valid checkpoint in the run directory), never, or a checkpoint path")
    sync_batchnorm: bool = _option(False, "convert BatchNorm layers to SyncBatchNorm (CUDA only)")
    find_unused_parameters: bool = _option(False, "let DDP tolerate parameters that get no gradient (slower)")
    ddp_bucket_cap_mb: int = _option(
        25,
        "DDP's gradient bucket size in MB: larger, fewer all-reduces; smaller, more of them overlap backward "
        "(DDP only)",
    )
    ddp_static_graph: bool = _option(
        False,
        "tell DDP the model's graph is the same every step, so it can skip its per-step bookkeeping "
        "(DDP only; not with --gradient-accumulation-steps above 1)",
    )
    ddp_comm_hook: str = _option(
        "none",
        "compress gradients to fp16 or bf16 for the all-reduce, halving the bytes sent: none, fp16 or bf16 "
        "(bf16: CUDA GPUs only; DDP only)",
    )
    strategy: str = _option(
        "ddp",
        "ddp (a full model, gradients and optimizer state on every rank) or fsdp "
        "(FSDP2: all three sharded across the ranks, for models that outgrow one device)",
    )
    fsdp_wrap: str = _option(
        "",
        "with --strategy fsdp: module class names, comma-separated, that become FSDP "
        "units (default: the built-in models' Block, a factory model's _no_split_modules)",
    )
    collective_timeout: float = _option(600.0, "seconds a collective may wait for a peer before the run fails")
    log_every: int = _option(10, "steps between loss reductions, telemetry records and progress updates")
    telemetry: bool = _option(True, "write per-rank metrics for the exporter")

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            # spec.type is the annotation's text ("int"): this module's annotations are strings (__future__)
            setattr(self, spec.name, _coerce(spec.name, getattr(self, spec.name), str(spec.type)))
        positive = (
            "batch_size",
            "grad_accum",
            "seq_len",
            "log_every",
            "bucket_size",
            "prefetch_factor",
            "ddp_bucket_cap_mb",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in (
            "max_steps",
            "epochs",
            "num_workers",
            "checkpoint_every",
            "keep_checkpoints",
            "warmup_steps",
            "eval_every",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_flag(name)} must be 0 or more, got {getattr(self, name)}")
        if self.keep_checkpoints == 0 and self.checkpoint_every:
            raise ConfigError(
                f"--checkpoint-every {self.checkpoint_every} saves checkpoints that --keep-checkpoints 0 keeps none of; "
                "pass --checkpoint-every 0 with it"
            )
        if self.max_steps == 0 and self.epochs == 0:
            raise ConfigError("set --max-steps or --epochs (both are 0, so training would never stop)")
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, float) and not math.isfinite(value):  # inf trains to NaN, nan compares false
                raise ConfigError(f"{_flag(spec.name)} must be a finite number, got {value}")
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_flag(name)} must be 0 or more, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"--seed must be 0 to {2**32 - 1} (numpy's seeds), got {self.seed}")
        if not 0 < self.lr < MAX_LEARNING_RATE:
            raise ConfigError(
                f"--learning-rate must be positive and below {MAX_LEARNING_RATE:g} (float32's range, which AdamW's "
                f"first update, 10x the rate, must fit), got {self.lr}"
            )
        if self.collective_timeout <= 0:
            raise ConfigError(f"--collective-timeout must be positive seconds, got {self.collective_timeout}")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"--eval-fraction must be in [0, 1), got {self.eval_fraction}")
        _require_choice("mixed_precision", self.mixed_precision, MIXED_PRECISION)
        _require_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _require_choice("compile_backend", self.compile_backend, COMPILE_BACKENDS)
        _require_choice("strategy", self.strategy, STRATEGIES)
        _require_choice("ddp_comm_hook", self.ddp_comm_hook, DDP_COMM_HOOKS)
        if self.num_workers == 0 and self.prefetch_factor != DEFAULT_PREFETCH_FACTOR:
            raise ConfigError(
                f"--prefetch-factor {self.prefetch_factor} needs --num-workers 1 or more: without workers the "
                "loop loads each batch itself when it needs it"
            )
        self._check_strategy_options()
        if not self.output_dir:
            raise ConfigError("--output-dir must not be empty")

    def _check_strategy_options(self) -> None:
        """The DDP-only switches mean nothing under FSDP: refuse them rather than ignore them."""
        if self.strategy == "fsdp" and self.sync_batchnorm:
            raise ConfigError(
                "--sync-batchnorm works with --strategy ddp only (FSDP does not convert BatchNorm); "
                "drop --sync-batchnorm or use --strategy ddp"
            )
        if self.strategy == "fsdp" and self.find_unused_parameters:
            raise ConfigError(
                "--find-unused-parameters is a DDP option; FSDP reduces only the gradients that "
                "exist, so drop it with --strategy fsdp"
            )
        if self.strategy == "fsdp" and self.compile:
            raise ConfigError(
                "--compile with --strategy fsdp is not supported yet (compiling before Accelerate "
                "shards the model is untested); drop --compile or use --strategy ddp"
            )
        changed = [f for f in DDP_ONLY if getattr(self, f) != _default(f)]
        if self.strategy == "fsdp" and changed:
            raise ConfigError(
                f"{_flag(changed[0])} is a DDP option; FSDP shards and reduces gradients its own way, so drop it "
                "with --strategy fsdp"
            )
        if self.ddp_static_graph and self.grad_accum > 1:
            raise ConfigError(
                "--ddp-static-graph needs --gradient-accumulation-steps 1: DDP's static graph must see a "
                "synchronised first step, and accumulation starts under no_sync"
            )
        if self.fsdp_wrap and self.strategy != "fsdp":
            raise ConfigError(f"--fsdp-wrap {self.fsdp_wrap} needs --strategy fsdp (DDP does not shard the model)")
        if any(not name.isidentifier() for name in self.fsdp_wrap_classes):
            raise ConfigError(f"--fsdp-wrap must be Python class names separated by commas, got {self.fsdp_wrap!r}")

    @property
    def fsdp_wrap_classes(self) -> list[str]:
        return [name.strip() for name in self.fsdp_wrap.split(",")] if self.fsdp_wrap else []

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


DDP_ONLY = ("ddp_bucket_cap_mb", "ddp_static_graph", "ddp_comm_hook")
"""Options DDP's wrapper takes: refused, not ignored, with --strategy fsdp."""


def _default(name: str) -> Any:
    return {f.name: f for f in dataclasses.fields(TrainConfig)}[name].default


def _flag(name: str) -> str:
    spec = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    return spec.metadata.get("flag") or "--" + name.replace("_", "-")


def _require_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")


def _coerce(name: str, value: Any, type_name: str) -> Any:
    """Config files give typed values; refuse the wrong type rather than guess (`batch_size = "16"` is a typo)."""
    expected = {"int": int, "float": float, "str": str, "bool": bool}[type_name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{name} must be {type_name}, got {value!r}")


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice, which it would otherwise take the last of silently (TOML
    refuses it itself)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"config file {path} is a directory; pass a .toml or .yaml file to --config")
    if not file.is_file():
        raise ConfigError(f"config file {path} not found; pass an existing .toml or .yaml file to --config")
    try:
        if file.suffix == ".toml":
            values = tomllib.loads(file.read_text())
        elif file.suffix in (".yaml", ".yml"):
            values = yaml.load(file.read_text(), Loader=_UniqueKeys) or {}
        else:
            raise ConfigError(f"config file {path} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        detail = str(error).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid {file.suffix[1:].upper()}: {detail}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold key = value pairs at the top level")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in values:
        normalized = key.replace("-", "_")
        if normalized not in known:
            close = difflib.get_close_matches(normalized, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see docs/training.md for the keys"
            raise ConfigError(f"unknown key {key!r} in {path}; {hint}")
    return {key.replace("-", "_"): value for key, value in values.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field, defaulting to None so that only flags the user gave override the file."""
    parser.add_argument("--config", help="TOML or YAML file of training options (flags override it)")
    group = parser.add_argument_group("training options (also config-file keys)")
    for spec in dataclasses.fields(TrainConfig):
        flags = ["--" + spec.name.replace("_", "-")]
        if spec.metadata.get("flag") and spec.metadata["flag"] not in flags:
            flags.insert(0, spec.metadata["flag"])
        cuda = f"; on CUDA GPUs {CUDA_DEFAULTS[spec.name]}" if spec.name in CUDA_DEFAULTS else ""
        help_text = f"{spec.metadata['help']} (default: {spec.default}{cuda})"
        if spec.type == "bool":
            group.add_argument(
                *flags, dest=spec.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            kind = {"int": int, "float": float, "str": str}[str(spec.type)]
            group.add_argument(*flags, dest=spec.name, type=kind, default=None, help=help_text)


def from_sources(args: argparse.Namespace, on_cuda: bool | None = None) -> TrainConfig:
    """The file, then the flags, then for what neither sets on CUDA ranks the CUDA defaults. `on_cuda`: whether
    the ranks will run on CUDA GPUs (the launcher knows; None: this process's ranks, decided here)."""
    values = read_config_file(args.config) if args.config else {}
    for spec in dataclasses.fields(TrainConfig):
        override = getattr(args, spec.name, None)
        if override is not None:
            values[spec.name] = override
    if not CUDA_DEFAULTS.keys() <= values.keys() and (ranks_use_cuda() if on_cuda is None else on_cuda):
        values = {**cuda_defaults(), **values}
    return TrainConfig(**values)


def ranks_use_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true", "yes")


def cuda_defaults() -> dict[str, Any]:
    import torch

    # Asked without emulation: bf16 emulated on a pre-Ampere GPU is slower than fp32.
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    return {**CUDA_DEFAULTS, "mixed_precision": "bf16" if bf16 else "no"}


def require_device_support(config: TrainConfig, on_cuda: bool, world_size: int) -> None:
    """What the ranks' device must offer for this configuration: the launcher asks before any rank starts, each
    rank again on the device Accelerate gave it."""
    if config.mixed_precision == "fp16" and not on_cuda:
        raise ConfigError("--mixed-precision fp16 needs CUDA GPUs; use bf16 or no for CPU ranks")
    if problem := missing_compiler(config, on_cuda):
        raise ConfigError(problem)
    if config.ddp_comm_hook == "bf16" and not on_cuda:
        raise ConfigError(
            "--ddp-comm-hook bf16 needs CUDA GPUs (DDP allows its bf16 hook over NCCL only); use fp16 or none "
            "for CPU ranks"
        )
    if config.sync_batchnorm and world_size > 1 and not on_cuda:
        raise ConfigError(
            "--sync-batchnorm needs CUDA GPUs (PyTorch's SyncBatchNorm has no CPU kernel); turn it off for CPU ranks"
        )


def missing_compiler(config, on_cuda: bool) -> str | None:
    """Why `--compile` cannot work here, or None. Inductor writes C++ for CPU kernels; on CUDA, Triton builds
    its kernel launchers with a C compiler. The other backends generate no code."""
    if not config.compile or config.compile_backend != "inductor":
        return None
    names = ("cc", "gcc", "clang") if on_cuda else ("g++", "clang++", "c++")
    if any(shutil.which(name) for name in names):
        return None
    return (
        f"--compile needs a {'C' if on_cuda else 'C++'} compiler ({' or '.join(names)} on PATH) for "
        f"torch.compile's inductor backend; install one (apt-get install build-essential), or drop --compile"
    )
