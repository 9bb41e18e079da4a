"""When a figure counts as a problem: one field per entry of trainstack/thresholds.py, defaulting to its value, so
`trainstack diagnose` and the alerts (generated from the same table) agree on what is wrong. A field per entry,
built from the table, so that a new threshold is one entry there and no second list here."""

from __future__ import annotations

import dataclasses

from trainstack import thresholds
from trainstack.errors import ConfigError


def _check_positive(self) -> None:
    for name, value in vars(self).items():
        if not value > 0:
            raise ConfigError(f"threshold {name.replace('_', '-')} must be positive, got {value}")


Thresholds = dataclasses.make_dataclass(
    "Thresholds",
    [(t.name, float, dataclasses.field(default=t.value)) for t in thresholds.THRESHOLDS],
    frozen=True,
    namespace={"__post_init__": _check_positive, "__doc__": __doc__},
)
