"""A rank's figures over the steady window of its records (trainstack/record.py): the ratios diagnose judges a
finished run by, the ceilings summary.json and the report state, compare's and tune's rates. Each is a ratio of
trainstack/ratios.py over the window's sums, as the exporter's counters give it over their rates.

Nothing here imports torch or monitoring/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainstack import breakdown, ratios, record
from trainstack.record import IntervalRecord
from trainstack.rundir import RunDir


@dataclass(frozen=True)
class RankWindow:
    """One rank's steady window, and its last record (how far it got, and when)."""

    rank: int
    records: list[IntervalRecord]
    last: IntervalRecord

    @property
    def stepped(self) -> float:
        return sum(r.stepped for r in self.records)

    @property
    def step_count(self) -> int:
        """The steps the window timed."""
        return sum(len(r.step_seconds) for r in self.records)

    @property
    def interval_seconds(self) -> float:
        return sum(r.interval_seconds for r in self.records)

    def total(self, field: Callable[[IntervalRecord], float | None]) -> float | None:
        """The window's sum of a record's `field`; None unless every record has it (a figure a rank measures, it
        measures in each)."""
        values = [field(r) for r in self.records]
        present = [value for value in values if value is not None]
        return sum(present) if present and len(present) == len(values) else None

    def _share(self, ratio: ratios.Ratio, seconds: float | None) -> float | None:
        return None if seconds is None else ratio.of(seconds, self.stepped)

    def _per_step(self, ratio: ratios.Ratio, total: float | None) -> float | None:
        return None if total is None else ratio.of(total, self.step_count)

    @property
    def steps_per_second(self) -> float | None:
        return self.step_count / self.interval_seconds if self.interval_seconds > 0 else None

    @property
    def samples_per_second(self) -> float | None:
        samples = self.total(lambda r: r.samples)
        return samples / self.interval_seconds if samples is not None and self.interval_seconds > 0 else None

    @property
    def data_wait_ratio(self) -> float | None:
        return self._share(ratios.DATA_WAIT_SHARE, self.total(lambda r: r.data_wait_seconds))

    @property
    def host_data_wait_ratio(self) -> float | None:
        return self._share(ratios.HOST_DATA_WAIT_SHARE, self.total(lambda r: r.host_data_wait_seconds))

    @property
    def host_bound_ratio(self) -> float | None:
        """None unless every record of the window measured it (NVML on a GPU)."""
        if not self.records or not all(r.host_bound_measured and r.time_parts for r in self.records):
            return None
        return self._share(
            ratios.HOST_BOUND_SHARE, sum((r.time_parts or {})[breakdown.HOST_BOUND] for r in self.records)
        )

    @property
    def comm_exposed_ratio(self) -> float | None:
        return self._share(ratios.COMM_EXPOSED_SHARE, self.total(lambda r: r.comm_exposed_seconds))

    @property
    def step_seconds(self) -> float | None:
        return ratios.STEP_SECONDS.of(self.stepped, self.step_count)

    @property
    def paused_ratio(self) -> dict[str, float]:
        """Pause (breakdown.PAUSES) -> the share of the window's wall time the rank spent in it, as the rate of its
        time counter in that part gives it live."""
        if self.interval_seconds <= 0:
            return {}
        paused: dict[str, float] = {}
        for r in self.records:
            for pause in r.paused or ():
                if pause.part in breakdown.PAUSES:
                    paused[pause.part] = paused.get(pause.part, 0.0) + pause.seconds
        return {part: seconds / self.interval_seconds for part, seconds in paused.items()}

    @property
    def forward_seconds(self) -> float | None:
        return self._per_step(ratios.FORWARD_SECONDS, self.total(lambda r: r.forward_seconds))

    @property
    def comm_seconds(self) -> float | None:
        return self._per_step(ratios.COMM_SECONDS, self.total(lambda r: r.comm_seconds))

    @property
    def comm_bytes_per_step(self) -> float | None:
        return self._per_step(ratios.COMM_BYTES_PER_STEP, self.total(lambda r: r.comm_bytes))


def of_rank(rank: int, launches: list[record.Launch]) -> RankWindow | None:
    """The rank's steady window; None where its last launch recorded no interval."""
    last_launch = launches[-1].records if launches else []
    if not last_launch:
        return None
    return RankWindow(rank, record.steady(launches), last_launch[-1])


def of_launches(by_rank: dict[int, list[record.Launch]]) -> list[RankWindow]:
    """Each rank's steady window, by rank, leaving out ranks whose last launch recorded none."""
    return [window for rank, launches in sorted(by_rank.items()) if (window := of_rank(rank, launches)) is not None]


def of_run(run_dir: Path | RunDir) -> list[RankWindow]:
    return of_launches(record.read_run(run_dir))
