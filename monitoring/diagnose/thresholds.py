"""When a figure counts as a problem: one field per entry of trainstack/thresholds.py, defaulting to its value, so
`trainstack diagnose` and the alerts (generated from the same table) agree on what is wrong. A field per entry,
built from the table, so that a new threshold is one entry there and no second list here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from trainstack import thresholds
from trainstack.errors import ConfigError


def _check_positive(self) -> None:
    for name, value in vars(self).items():
        if not value > 0:
            raise ConfigError(f"threshold {name.replace('_', '-')} must be positive, got {value}")


if TYPE_CHECKING:
    # What mypy sees of the class built below: a field per table entry, each a float, read by name. mypy cannot
    # run make_dataclass, and a class statement listing the fields would be the second list the table avoids.
    class Thresholds:
        def __init__(self, **limits: float) -> None: ...

        def __getattr__(self, name: str) -> float: ...

else:
    Thresholds = dataclasses.make_dataclass(
        "Thresholds",
        [(t.name, float, dataclasses.field(default=t.value)) for t in thresholds.THRESHOLDS],
        frozen=True,
        namespace={"__post_init__": _check_positive, "__doc__": __doc__},
    )
