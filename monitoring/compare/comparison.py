"""Two profiles side by side as tables (lists of rows), which the terminal and the HTML page both show."""

from __future__ import annotations

from dataclasses import dataclass

from trainstack import breakdown
from trainstack.errors import ConfigError
from trainstack.monitoring.compare.profile import RunProfile

MOVED = "<- moved most"


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


@dataclass(frozen=True)
class Comparison:
    a: RunProfile
    b: RunProfile

    def __post_init__(self) -> None:
        # Throughput of two different models compares nothing: refuse rather than print a misleading ratio.
        for what, x, y in (
            ("model", self.a.model, self.b.model),
            ("parameter bytes", self.a.param_bytes, self.b.param_bytes),
        ):
            if x is not None and y is not None and x != y:
                built = (
                    ": one model built for another vocabulary or --seq-len (the dataset sets the vocabulary)"
                    if what == "parameter bytes" and self.a.model is not None and self.a.model == self.b.model
                    else ""
                )
                raise ConfigError(
                    f"{self.a.run_dir} and {self.b.run_dir} train different models ({what} {x} vs "
                    f"{y}{built}): compare runs of one model"
                )

    @property
    def speedup(self) -> float | None:
        """B's steady steps/s over A's."""
        return _ratio(
            self.a.rate.steps_per_second if self.a.rate else None, self.b.rate.steps_per_second if self.b.rate else None
        )

    def headline(self) -> list[dict]:
        def rate(profile: RunProfile, field: str) -> float | None:
            return getattr(profile.rate, field) if profile.rate else None

        rows = [
            ("steps/s (steady, ranks' median)", rate(self.a, "steps_per_second"), rate(self.b, "steps_per_second")),
            ("samples/s (steady, all ranks)", rate(self.a, "samples_per_second"), rate(self.b, "samples_per_second")),
            ("goodput (compute / wall time)", self.a.goodput, self.b.goodput),
        ]
        return [{"": name, "A": x, "B": y, "B / A": _ratio(x, y)} for name, x, y in rows]

    def moved_most(self) -> str | None:
        """The step part whose seconds per step changed the most between the runs."""
        changes = {
            part: abs(self.b.seconds_per_step.get(part, 0.0) - self.a.seconds_per_step.get(part, 0.0))
            for part in breakdown.STEP_PARTS
            if part in self.a.seconds_per_step or part in self.b.seconds_per_step
        }
        return max(changes, key=lambda part: changes[part]) if changes and max(changes.values()) > 0 else None

    def parts(self) -> list[dict]:
        moved = self.moved_most()
        rows = []
        for part in breakdown.PARTS:
            x, y = self.a.seconds_per_step.get(part), self.b.seconds_per_step.get(part)
            unit = "s per step" if part in breakdown.STEP_PARTS else "s per rank"
            rows.append(
                {
                    "part": part,
                    "unit": unit,
                    "A": x,
                    "B": y,
                    "B - A": None if x is None or y is None else y - x,
                    "": MOVED if part == moved else "",
                }
            )
        return rows

    def ranks(self) -> list[dict]:
        ranks = sorted(set(self.a.rank_step_seconds) | set(self.b.rank_step_seconds))
        return [
            {
                "rank": rank,
                "A median step (ms)": _ms(self.a.rank_step_seconds.get(rank)),
                "B median step (ms)": _ms(self.b.rank_step_seconds.get(rank)),
            }
            for rank in ranks
        ]

    def verdicts(self) -> list[dict]:
        """Each run's verdicts; "healthy" only where it was judged, else "not judged" and why."""
        return [
            {"run": name, "verdict": kind, "ceiling": text}
            for name, profile in (("A", self.a), ("B", self.b))
            for kind, text in (
                profile.verdicts or ({"not judged": profile.not_judged} if profile.not_judged else {"healthy": ""})
            ).items()
        ]

    def settings(self) -> list[dict]:
        """The settings that differ (config.yaml, summary.json, records, each node's recorded environment); those only
        one run records are shown."""
        keys = sorted(set(self.a.settings) | set(self.b.settings))
        return [
            {"setting": key, "A": self.a.settings.get(key, "-"), "B": self.b.settings.get(key, "-")}
            for key in keys
            if self.a.settings.get(key) != self.b.settings.get(key)
        ]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds
