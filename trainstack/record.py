"""A rank's records file, telemetry/rank-<r>.jsonl, as types: the one definition of its lines, its one reader, its
one split into launches and its one steady window.

A rank appends three kinds of line, one JSON object each (docs/architecture.md, "A telemetry/rank-<r>.jsonl
record"): a `SegmentStarted` marker as each launch (segment) begins, an `IntervalRecord` every log interval, and a
`SegmentEnded` line as the rank exits (a killed rank writes none). Optional fields are absent from the JSON where
they are None, so a record says what its rank measured and nothing it did not.

The steady window, which every figure, ratio, ceiling and verdict of a finished run reads (diagnose, compare, the
report, summary.json, tune, `bench scaling --predict`): the last launch's interval records after its first. The
first record of a launch holds its warm-up (first batches, the allocator, compilation), which a short run would
otherwise be judged by; the last launch is what the run ended on, so a resumed run is judged by the hosts and code
it ran last. Only the time breakdown (trainstack/breakdown.py) reads every record of every launch: it accounts for
each second of the wall time, warm-up and lost launches included.

Versions: a line without `version` is version 1 (records written before the field existed have the same keys).
A line of a newer version than RECORD_VERSION is refused with one line (ConfigError). A line that is not JSON is
one a kill cut off (the next launch ends it first): skipped.

Nothing here imports torch: the launcher, the exporter's neighbours and the report read records through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from trainstack.errors import ConfigError
from trainstack.rundir import RunDir

RECORD_VERSION = 1
SEGMENT_MARKER = "segment_started"  # the key that makes a line a SegmentStarted marker (its value: when)
SEGMENT_ENDED = "segment_ended"  # the key that makes a line a SegmentEnded line (its value: when)


@dataclass(frozen=True, slots=True)
class Pause:
    """A pause (or the startup) that ended in an interval, `after_steps` of its steps before it."""

    part: str
    seconds: float
    after_steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "seconds": self.seconds, "after_steps": self.after_steps}


def pauses(entries: Iterable[dict]) -> tuple[Pause, ...]:
    return tuple(Pause(entry["part"], entry["seconds"], entry["after_steps"]) for entry in entries)


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One log interval of one rank. Field meanings: docs/architecture.md; times on the rank's `clock`."""

    time: float
    rank: int
    step: int
    epoch: int
    loss: float | None  # written as null where the loop gave its monitor none
    lr: float | None
    samples: int
    tokens: int
    interval_seconds: float
    data_wait_seconds: float
    step_seconds: tuple[float, ...]
    host_data_wait_seconds: float | None = None  # records older than the field had only the host's wait
    clock: str | None = None  # "gpu" | "host"; records older than the field were timed on the host
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    forward_seconds: float | None = None  # only where the loop marks its forward passes
    comm_seconds: float | None = None  # the four comm fields: DDP and FSDP ranks only
    comm_exposed_seconds: float | None = None
    comm_bytes: int | None = None
    comm_buckets: int | None = None
    step_count: int | None = None  # the breakdown's four fields: records older than it have none
    time_parts: dict[str, float] | None = None
    paused: tuple[Pause, ...] | None = None
    host_bound_measured: bool | None = None
    sm_active_ratio: float | None = None  # GPM (Hopper and newer) only
    tensor_active_ratio: float | None = None
    version: int = RECORD_VERSION

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"loss", "lr"})
    """Optional fields written even when None."""

    @property
    def stepped(self) -> float:
        """The interval's step time: the sum of its steps' durations."""
        return sum(self.step_seconds)

    @property
    def pauses(self) -> tuple[Pause, ...]:
        return self.paused or ()

    @property
    def first_step(self) -> int:
        """The step the interval started from."""
        return self.step - (self.step_count or 0)

    def to_json(self) -> str:
        line: dict[str, Any] = {"version": self.version}
        for name in _INTERVAL_FIELDS:
            value = getattr(self, name)
            if name == "version" or (value is None and name not in self.ALWAYS):
                continue
            if name == "step_seconds":
                value = list(value)
            elif name == "paused":
                value = [pause.to_dict() for pause in value]
            line[name] = value
        return json.dumps(line)

    @classmethod
    def from_json(cls, line: dict) -> IntervalRecord:
        known = {item.name for item in fields(cls)}
        values = {key: value for key, value in line.items() if key in known}
        if "step_seconds" in values:
            values["step_seconds"] = tuple(values["step_seconds"])
        if values.get("paused") is not None:
            values["paused"] = pauses(values["paused"])
        return cls(**values)


_INTERVAL_FIELDS = tuple(item.name for item in fields(IntervalRecord))
"""Asked once: `fields` builds its tuple at every call, and a rank writes a record every interval."""


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    """The first line a launch appends. Markers older than `launched_at` come from a trainstack that did not measure
    the time breakdown."""

    started: float
    rank: int
    run_id: str | None = None
    launched_at: float | None = None
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        line = {"version": self.version, SEGMENT_MARKER: self.started, "rank": self.rank, "run_id": self.run_id}
        return json.dumps(line | ({} if self.launched_at is None else {"launched_at": self.launched_at}))

    @classmethod
    def from_json(cls, line: dict) -> SegmentStarted:
        return cls(
            line[SEGMENT_MARKER], line["rank"], line.get("run_id"), line.get("launched_at"), line.get("version", 1)
        )


@dataclass(frozen=True, slots=True)
class SegmentEnded:
    """The last line of a launch whose rank exited: the pauses since its last record (the final checkpoint and
    evaluation), and when it exited."""

    ended: float
    rank: int
    step_count: int
    paused: tuple[Pause, ...]
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                SEGMENT_ENDED: self.ended,
                "rank": self.rank,
                "step_count": self.step_count,
                "paused": [pause.to_dict() for pause in self.paused],
            }
        )

    @classmethod
    def from_json(cls, line: dict) -> SegmentEnded:
        return cls(
            line[SEGMENT_ENDED], line["rank"], line["step_count"], pauses(line["paused"]), line.get("version", 1)
        )


Line = IntervalRecord | SegmentStarted | SegmentEnded


def parse(line: dict, where: str) -> Line | None:
    """One line of a records file; None for a line that is none of the three (nothing a reader uses). `where` names
    the line in the one-line error a newer or broken record gives."""
    version = line.get("version", 1)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise ConfigError(
            f"{where} is a record of version {version!r}, newer than this trainstack reads ({RECORD_VERSION}); "
            "upgrade trainstack to read it"
        )
    try:
        if SEGMENT_MARKER in line:
            return SegmentStarted.from_json(line)
        if SEGMENT_ENDED in line:
            return SegmentEnded.from_json(line)
        if "time" in line:
            return IntervalRecord.from_json(line)
    except (KeyError, TypeError) as error:
        raise ConfigError(
            f"{where} is not a trainstack record ({type(error).__name__}: {error}); move the file away"
        ) from None
    return None


def read_lines(path: Path) -> list[Line]:
    """Every line of a rank's records file, in file order. A line a kill cut off or the storage damaged (not JSON,
    or not UTF-8) is skipped."""
    lines: list[Line] = []
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(decoded, dict) and (parsed := parse(decoded, f"{path} line {number}")) is not None:
            lines.append(parsed)
    return lines


@dataclass(frozen=True)
class Launch:
    """One launch (segment) of one rank, as its records file tells it."""

    started: SegmentStarted | None
    """None: records no marker precedes, from a trainstack that wrote none."""
    records: list[IntervalRecord] = field(default_factory=list)
    """In file order."""
    ended: SegmentEnded | None = None
    """None: the rank was killed (or the launch is still running)."""

    @property
    def steady(self) -> list[IntervalRecord]:
        """The launch's records after its first, whose steps hold the warm-up."""
        return self.records[1:]

    def between_steps(self, after: int, upto: int) -> Launch:
        """The launch cut to the intervals whose steps all lie in (after, upto]: one phase of a run that changes
        what it does at known steps. Its first record is then the phase's first, whose steps mix with the phase
        before it, and `steady` leaves it out as it leaves out the warm-up. No `ended`: the cut ends no launch."""
        return Launch(self.started, [r for r in self.records if r.first_step >= after and r.step <= upto])


def launches(lines: Iterable[Line]) -> list[Launch]:
    """A rank's lines split into its launches, at each marker."""
    found: list[Launch] = []
    for line in lines:
        if isinstance(line, SegmentStarted):
            found.append(Launch(line))
            continue
        if not found:
            found.append(Launch(None))
        if isinstance(line, SegmentEnded):
            found[-1] = Launch(found[-1].started, found[-1].records, line)
        else:
            found[-1].records.append(line)
    return found


def read_launches(path: Path) -> list[Launch]:
    return launches(read_lines(path))


def read_run(run_dir: Path | RunDir) -> dict[int, list[Launch]]:
    """Every rank's launches, by global rank."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return {rank: read_launches(path) for rank, path in run.all_rank_records().items()}


def records(rank_launches: list[Launch]) -> list[IntervalRecord]:
    """A rank's interval records over every launch, in file order (what the report plots)."""
    return [record for launch in rank_launches for record in launch.records]


def steady(rank_launches: list[Launch]) -> list[IntervalRecord]:
    """The steady window of a rank's launches: the last launch's records after its first."""
    return rank_launches[-1].steady if rank_launches else []
