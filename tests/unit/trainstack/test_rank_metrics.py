"""A rank's series as its telemetry updates them (trainstack/telemetry/metrics.py): held in memory and written when
published, the progress counts from the hang responder's thread as well as from the loop's."""

from __future__ import annotations

import threading

from trainstack.telemetry.metrics import CountedSeries, HeldSeries, RankMetrics


class Series:
    """A prometheus_client series as a rank's file would hold it: what was written, and how many writes."""

    def __init__(self) -> None:
        self.value, self.writes = 0.0, 0
        self.children: dict[tuple[str, ...], Series] = {}

    def inc(self, amount: float = 1) -> None:
        self.value += amount
        self.writes += 1

    def set(self, value: float) -> None:
        self.value = value
        self.writes += 1

    def labels(self, *labels: str) -> Series:
        return self.children.setdefault(labels, Series())


def test_the_counts_written_by_the_responders_thread_and_by_the_loop_add_up_to_what_was_counted():
    series = Series()
    counted = CountedSeries(series)
    for _ in range(5):
        counted.inc()

    def responder_polls() -> None:
        counted.publish()

    for _ in range(2):  # a poll with nothing counted since the last writes nothing
        thread = threading.Thread(target=responder_polls)
        thread.start()
        thread.join()
    assert (series.value, series.writes) == (5, 1)
    counted.inc(3)
    counted.publish()  # the loop's own, at its second
    assert (series.value, series.writes) == (8, 2)


def test_what_a_step_and_a_record_update_reaches_the_file_only_when_published():
    series = {name: Series() for name in ("steps", "tokens", "loss", "time")}
    metrics = RankMetrics.off()
    metrics = RankMetrics(
        **{
            **{name: getattr(metrics, name) for name in RankMetrics.__dataclass_fields__ if not name.startswith("_")},
            "steps": CountedSeries(series["steps"]),
            "tokens": HeldSeries(series["tokens"]),
            "loss": HeldSeries(series["loss"]),
            "time": series["time"],
            "rank": "3",
        }
    )
    for _ in range(5):
        metrics.steps.inc()
        metrics.tokens.inc(128)
        metrics.time_of("compute").inc(0.25)
    metrics.loss.set(2.5)
    assert metrics.time_of("compute") is metrics.time_of("compute")  # one labelled child, asked once
    assert [s.writes for s in series.values()] == [0, 0, 0, 0]
    assert series["time"].children[("3", "compute")].value == 0

    metrics.publish_progress()  # the responder's share: the counts alone
    assert (series["steps"].value, series["tokens"].writes) == (5, 0)
    metrics.publish()
    assert (series["steps"].value, series["tokens"].value, series["loss"].value) == (5, 640, 2.5)
    assert series["time"].children[("3", "compute")].value == 1.25
    assert series["steps"].writes == 1  # nothing counted since the responder wrote: nothing written again
