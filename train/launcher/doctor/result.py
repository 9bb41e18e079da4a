"""What a doctor check returns, and how a list of them is shown: a table for people, JSON for programs."""

from __future__ import annotations

import enum
import json
from collections import Counter
from dataclasses import asdict, dataclass


class Status(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"  # the run starts, but will not use the hardware well
    FAIL = "FAIL"  # the run would crash or hang: the launcher refuses to start it


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status is not Status.PASS and not self.fix:
            raise ValueError(f"doctor check {self.name!r} reports {self.status} without a fix")


def has_failures(results: list[CheckResult]) -> bool:
    return any(result.status is Status.FAIL for result in results)


def summary_line(results: list[CheckResult]) -> str:
    counts = Counter(result.status for result in results)
    return "doctor: " + ", ".join(f"{counts[status]} {status}" for status in Status)


def render_table(results: list[CheckResult]) -> str:
    """One row per check; each non-PASS row is followed by its fix, indented under the detail."""
    width = max(len(result.name) for result in results)
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  DETAIL"]
    for result in results:
        lines.append(f"{result.status:<6}  {result.name:<{width}}  {result.detail}")
        if result.fix:
            lines.append(f"{'':<6}  {'':<{width}}  fix: {result.fix}")
    lines.append(summary_line(results))
    return "\n".join(lines)


def render_json(results: list[CheckResult]) -> str:
    return json.dumps({"ok": not has_failures(results), "checks": [asdict(result) for result in results]}, indent=2)
