"""The ahead renderer (monitoring/exporter/prerender.py): the schedule it learns from scrapes, and what it promises
about freshness: a body rendered ahead serves one scrape, within MAX_AGE_SECONDS; everything else is rendered on
request. Driven with a fake clock and `render_ahead()` called directly, as the renderer's thread calls it."""

from __future__ import annotations

import gzip
import threading

import pytest

from trainstack.monitoring.exporter.prerender import LEAD_SECONDS, MAX_AGE_SECONDS, MIN_PERIOD_SECONDS, AheadRenderer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Renders:
    """The body a render returns says which render it was: render 1, render 2, ..."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bytes:
        self.count += 1
        return f"render {self.count}\n".encode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def renders() -> Renders:
    return Renders()


@pytest.fixture
def renderer(clock, renders) -> AheadRenderer:
    return AheadRenderer(renders, clock)


def scrape(renderer: AheadRenderer, clock: Clock, at: float, gzip_accepted: bool = False):
    clock.now = at
    body = renderer.take_ahead(gzip_accepted)
    return body if body is not None else renderer.render_on_request(gzip_accepted)


def test_a_steady_scraper_is_rendered_for_ahead_of_its_next_scrape(renderer, clock, renders):
    for at in (100.0, 101.0):
        assert not scrape(renderer, clock, at).ahead
        assert renderer.due() is None  # two scrapes are one interval: not yet a schedule
    scrape(renderer, clock, 102.0)
    assert renderer.due() == pytest.approx(103.0 - LEAD_SECONDS)
    clock.now = renderer.due()
    renderer.render_ahead()
    assert renders.count == 4 and renderer.due() is None
    body = scrape(renderer, clock, 103.0)
    assert body.ahead and body.raw == b"render 4\n" and renders.count == 4  # nothing rendered for the scrape itself
    assert renderer.due() == pytest.approx(104.0 - LEAD_SECONDS)


def test_a_body_rendered_ahead_serves_one_scrape_only(renderer, clock, renders):
    for at in (100.0, 101.0, 102.0):
        scrape(renderer, clock, at)
    clock.now = renderer.due()
    renderer.render_ahead()
    assert scrape(renderer, clock, 103.0).raw == b"render 4\n"
    again = scrape(renderer, clock, 103.001)  # what changed since the last scrape shows
    assert not again.ahead and again.raw == b"render 5\n"


def test_a_body_rendered_ahead_is_not_served_past_its_maximum_age(renderer, clock, renders):
    for at in (100.0, 101.0, 102.0):
        scrape(renderer, clock, at)
    clock.now = rendered_at = renderer.due()
    renderer.render_ahead()
    late = scrape(renderer, clock, rendered_at + MAX_AGE_SECONDS + 0.01)
    assert not late.ahead and late.raw == b"render 5\n"


def test_a_scraper_faster_than_the_minimum_period_is_always_rendered_on_request(renderer, clock, renders):
    period = MIN_PERIOD_SECONDS / 2
    bodies = [scrape(renderer, clock, 100.0 + k * period) for k in range(6)]
    assert renderer.due() is None
    assert [body.ahead for body in bodies] == [False] * 6 and renders.count == 6


def test_an_ha_pair_alternating_two_intervals_is_predicted(renderer, clock):
    """Two Prometheus servers 0.3 s apart, each every 1 s: the next scrape is the interval before the last away."""
    for at in (100.0, 100.3, 101.0, 101.3):
        scrape(renderer, clock, at)
    assert renderer.due() == pytest.approx(102.0 - LEAD_SECONDS)
    scrape(renderer, clock, 102.0)
    assert renderer.due() == pytest.approx(102.3 - LEAD_SECONDS)


def test_a_scrape_meeting_a_render_in_progress_waits_for_it_instead_of_rendering_again(clock):
    started, release, count = threading.Event(), threading.Event(), []

    def slow_render() -> bytes:
        count.append(1)
        if len(count) == 4:  # the render ahead
            started.set()
            release.wait(10)
        return f"render {len(count)}\n".encode()

    renderer = AheadRenderer(slow_render, clock)
    for at in (100.0, 101.0, 102.0):
        scrape(renderer, clock, at)
    clock.now = renderer.due()
    ahead = threading.Thread(target=renderer.render_ahead)
    ahead.start()
    assert started.wait(10)
    clock.now = 103.0
    assert renderer.take_ahead(False) is None  # never blocks: the server's event loop calls it
    threading.Timer(0.05, release.set).start()
    body = renderer.render_on_request(False)
    ahead.join(10)
    assert body.ahead and body.raw == b"render 4\n" and len(count) == 4


def test_a_failed_render_ahead_leaves_the_scrape_to_render_on_request(clock, caplog):
    failing = iter([b"render 1\n", b"render 2\n", b"render 3\n", RuntimeError("half-written file"), b"render 5\n"])

    def render() -> bytes:
        result = next(failing)
        if isinstance(result, Exception):
            raise result
        return result

    renderer = AheadRenderer(render, clock)
    for at in (100.0, 101.0, 102.0):
        scrape(renderer, clock, at)
    clock.now = renderer.due()
    renderer.render_ahead()
    assert "rendering /metrics ahead of the next scrape failed" in caplog.text
    body = scrape(renderer, clock, 103.0)
    assert not body.ahead and body.raw == b"render 5\n"


def test_the_body_is_gzipped_ahead_when_the_scraper_asks_for_gzip(renderer, clock):
    for at in (100.0, 101.0, 102.0):
        scrape(renderer, clock, at, gzip_accepted=True)
    clock.now = renderer.due()
    renderer.render_ahead()
    body = scrape(renderer, clock, 103.0, gzip_accepted=True)
    assert body.ahead and body.gzipped is not None
    assert gzip.decompress(body.encoded(True)) == body.raw == body.encoded(False)


def test_the_thread_renders_when_due_and_stops(renders):
    """Real time: three scrapes a little over MIN_PERIOD_SECONDS apart teach the schedule; the thread renders the
    fourth's body by itself, which the fourth scrape is served."""
    renderer = AheadRenderer(renders)
    renderer.start()
    try:
        pause = threading.Event()
        for _ in range(3):
            pause.wait(MIN_PERIOD_SECONDS + 0.05)
            renderer.take_ahead(False) or renderer.render_on_request(False)
        assert renderer.due() is not None
        for _ in range(200):  # the render is due in about MIN_PERIOD_SECONDS
            if renders.count == 4:
                break
            pause.wait(0.01)
        assert renders.count == 4 and renderer.due() is None
        body = renderer.take_ahead(False)
        assert body is not None and body.ahead and body.raw == b"render 4\n"
    finally:
        renderer.stop()
    assert not renderer._thread.is_alive()
