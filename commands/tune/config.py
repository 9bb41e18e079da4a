"""TuneConfig: what tune starts from and how long it may try, checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainstack.errors import ConfigError
from trainstack.rundir import CONFIG_FILE, check_file_path, check_run_dir
from trainstack.train.rank.config import TrainConfig, read_config_file

DEFAULT_MIN_ROUNDS = 2


@dataclass(frozen=True)
class TuneConfig:
    source: Path
    """A config file `trainstack train --config` takes, or a run directory (its config file)."""
    write: Path
    """Where the winning options go, as a config file; never an existing file."""
    page: Path | None = None
    """Where the baseline-against-winner comparison goes, as an HTML page; never an existing file. None: beside
    `write`, with .html for its suffix."""
    steps: int = 20
    """Optimizer steps per trial; the first log interval is warm-up and not timed."""
    min_rounds: int | None = None
    """Rounds before a candidate can be decided; None: DEFAULT_MIN_ROUNDS, or max_rounds where that is fewer."""
    max_rounds: int = 3
    """A round runs the baseline, then each candidate still undecided; a ratio per candidate per round."""
    budget_seconds: float = 900.0
    """No new round starts once this much time has passed."""
    scratch: Path | None = None
    """Where the trials' run directories go (removed afterwards); None: a fresh temporary folder."""

    def __post_init__(self) -> None:
        if not (self.source.is_file() or (self.source / CONFIG_FILE).is_file()):
            raise ConfigError(f"{self.source} is neither a config file nor a run directory with {CONFIG_FILE}")
        if self.write.exists():
            raise ConfigError(f"{self.write} exists; tune never overwrites a file: pass --write NEW_PATH")
        check_file_path(self.write, "--write")  # now, not once the trials have run
        if self.write.suffix not in (".yaml", ".yml"):
            raise ConfigError(f"--write {self.write} must end in .yaml or .yml (trainstack train --config reads it)")
        if self.html.exists():
            raise ConfigError(f"{self.html} exists; tune never overwrites a file: pass --html NEW_PATH")
        check_file_path(self.html, "--html")
        if self.scratch is not None:
            check_run_dir(self.scratch, "--scratch")
        if self.steps < 10:
            raise ConfigError(f"--steps must be at least 10 (a warm-up interval and timed ones), got {self.steps}")
        if not 1 <= self.rounds_before_deciding <= self.max_rounds:
            raise ConfigError(
                f"rounds: need 1 <= --min-rounds <= --max-rounds, got {self.rounds_before_deciding} and "
                f"{self.max_rounds}"
            )
        if not self.budget_seconds > 0:
            raise ConfigError(f"--budget must be positive seconds, got {self.budget_seconds}")
        self.baseline()  # a config the app refuses is bad input now, not a failed trial later

    @property
    def rounds_before_deciding(self) -> int:
        """`--max-rounds 1` alone asks for one round: the default minimum yields to it."""
        return min(DEFAULT_MIN_ROUNDS, self.max_rounds) if self.min_rounds is None else self.min_rounds

    @property
    def html(self) -> Path:
        return self.page or self.write.with_suffix(".html")

    def baseline(self) -> TrainConfig:
        path = self.source if self.source.is_file() else self.source / CONFIG_FILE
        return TrainConfig(**read_config_file(str(path)))
