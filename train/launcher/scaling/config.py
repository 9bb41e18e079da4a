"""ScalingConfig: what the scaling benchmark runs, checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainstack.errors import ConfigError


def default_device_counts(available: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the devices there are, and all of them: 8 GPUs give 1, 2, 4, 8; 6 give 1, 2, 4, 6."""
    counts = {available}
    count = 1
    while count < available:
        counts.add(count)
        count *= 2
    return tuple(sorted(counts))


@dataclass(frozen=True)
class ScalingConfig:
    gpus: int
    """GPUs on this host; 0 runs DDP on 1 and 2 CPU ranks and no DataParallel."""
    output_dir: Path = Path("runs/bench-scaling")
    max_steps: int = 100
    batch_size: int = 16
    """Per device, as in `trainstack train`: the global batch grows with the devices (weak scaling)."""
    model: str = "builtin:tiny-gpt"
    dataset: str = "builtin:sequences"
    seq_len: int = 128
    num_workers: int = 2
    mixed_precision: str = "no"
    devices: tuple[int, ...] = field(default=())
    """Device counts to run; empty: default_device_counts (1 and 2 CPU ranks without a GPU)."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"--num-workers must be 0 or more, got {self.num_workers}")
        if not self.gpus and self.mixed_precision == "fp16":
            raise ConfigError("--mixed-precision fp16 needs GPUs; use bf16 or no on CPU ranks")
        if not self.devices:
            object.__setattr__(self, "devices", default_device_counts(self.gpus) if self.gpus else (1, 2))
        if min(self.devices) < 1:
            raise ConfigError(f"--devices must be positive counts, got {','.join(map(str, self.devices))}")
        if self.gpus and max(self.devices) > self.gpus:
            raise ConfigError(f"--devices asks for {max(self.devices)} GPUs but this host has {self.gpus}")

    @property
    def training_flags(self) -> list[str]:
        """The flags both modes train with, so they run the same model on the same data."""
        return [
            "--max-steps",
            str(self.max_steps),
            "--batch-size",
            str(self.batch_size),
            "--model",
            self.model,
            "--dataset",
            self.dataset,
            "--seq-len",
            str(self.seq_len),
            "--num-workers",
            str(self.num_workers),
            "--mixed-precision",
            self.mixed_precision,
        ]
