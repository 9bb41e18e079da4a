"""The /metrics body, rendered just before the scrape that will ask for it.

Rendering a body costs 3-7 ms of CPU for 8 GPUs and 8 ranks (merging the ranks' multiprocess files is most of it,
then encoding; bench/scrape_cost.py), so on a busy host a scrape that renders its own body waits that long and more.
Prometheus scrapes a target on a fixed schedule, so the exporter learns the schedule from the requests it gets and
renders the body LEAD_SECONDS before the next scrape is due, on a thread of its own; that scrape only sends bytes.
It still costs one render per scrape, as rendering on request did: an exporter nobody scrapes renders at most once
more after the last scrape and then waits. (Rendering on the sampler's cadence instead, as dcgm-exporter serves its
collect interval, would cost a render every second whatever the scrape interval: 15 for one scrape at Prometheus'
default 15 s.)

Freshness, what a reader of the numbers can rely on:
- a body rendered ahead serves one scrape only, and only within MAX_AGE_SECONDS of being rendered: its training
  values are at most that old (GPU values are as old as the sampler's snapshot, whichever path renders them);
- every other request is rendered on request as before: the first scrapes, a scraper faster than
  MIN_PERIOD_SECONDS, a person with curl, a scrape that came later than predicted; so no response is older than
  one served before it.

The schedule is the interval before the last one: for one scraper that is its interval; for an HA pair of
Prometheus servers, whose scrapes of one target alternate two intervals, it is the one that comes next.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

GZIP_LEVEL = 1  # ~20% larger than level 9 (5 KiB for 8 GPUs and 8 ranks) at a fourteenth of the CPU
LEAD_SECONDS = 0.05  # a render takes 3-25 ms on a busy 2-core host; a scrape that meets one in progress waits for it
MAX_AGE_SECONDS = 0.5
MIN_PERIOD_SECONDS = 0.2  # below this the render ahead would start before the previous scrape has been answered
WAIT_FOR_AHEAD_SECONDS = 1.0  # a render ahead that takes longer than this (a stalled disk) is not waited for


@dataclass(frozen=True)
class Body:
    raw: bytes
    gzipped: bytes | None
    rendered_at: float
    ahead: bool
    """Rendered ahead of the scrape it serves, not on request."""

    def encoded(self, gzip_accepted: bool) -> bytes:
        if not gzip_accepted:
            return self.raw
        return self.gzipped if self.gzipped is not None else gzip.compress(self.raw, compresslevel=GZIP_LEVEL)


class AheadRenderer:
    """Serves the bodies of /metrics; `render` is called on the renderer's thread and on request threads at once."""

    def __init__(self, render: Callable[[], bytes], clock: Callable[[], float] = time.monotonic):
        self._render = render
        self._clock = clock
        self._changed = threading.Condition()
        self._scrapes: deque[float] = deque(maxlen=3)
        self._gzip_wanted = False
        self._due: float | None = None
        self._rendering_ahead = False
        self._ahead: Body | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="exporter-render-ahead", daemon=True)

    def take_ahead(self, gzip_accepted: bool) -> Body | None:
        """A scrape arrives now: the body rendered ahead for it, if one is ready; never blocks (the server's event
        loop calls it). None: call `render_on_request`."""
        now = self._clock()
        with self._changed:
            self._scrapes.append(now)
            self._gzip_wanted = gzip_accepted
            ahead = None if self._rendering_ahead else self._take_fresh(now)
            self._due = self._next_render()
            self._changed.notify_all()
        return ahead

    def render_on_request(self, gzip_accepted: bool) -> Body:
        """The body for a scrape `take_ahead` had none for: the render ahead in progress if there is one (started
        for this scrape, a few ms from done), else a new one. Blocks."""
        with self._changed:
            self._changed.wait_for(lambda: not self._rendering_ahead, WAIT_FOR_AHEAD_SECONDS)
            ahead = self._take_fresh(self._clock())
        return ahead if ahead is not None else self._body(ahead=False, gzip_accepted=gzip_accepted)

    def _take_fresh(self, now: float) -> Body | None:
        ahead, self._ahead = self._ahead, None
        return ahead if ahead is not None and now - ahead.rendered_at <= MAX_AGE_SECONDS else None

    def _next_render(self) -> float | None:
        if len(self._scrapes) < 3:
            return None
        first, before_last, last = self._scrapes
        period = before_last - first
        return last + period - LEAD_SECONDS if period >= MIN_PERIOD_SECONDS else None

    def _body(self, ahead: bool, gzip_accepted: bool) -> Body:
        rendered_at = self._clock()
        raw = self._render()
        gzipped = gzip.compress(raw, compresslevel=GZIP_LEVEL) if ahead and gzip_accepted else None
        return Body(raw, gzipped, rendered_at, ahead)

    def due(self) -> float | None:
        """When the next render ahead is due (on the renderer's clock); None: no schedule learned."""
        with self._changed:
            return self._due

    def render_ahead(self) -> None:
        """Render the body for the next scrape now. The renderer's thread calls this when it is due; tests call it
        directly to drive the renderer without sleeping."""
        with self._changed:
            self._due, self._rendering_ahead, gzip_wanted = None, True, self._gzip_wanted
        body = None
        try:
            body = self._body(ahead=True, gzip_accepted=gzip_wanted)
        except Exception:  # the scrape renders on request and shows the same failure, if it lasts
            log.exception("rendering /metrics ahead of the next scrape failed")
        finally:
            with self._changed:
                self._ahead, self._rendering_ahead = body, False
                self._changed.notify_all()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (self._due is None or self._due > self._clock()):
                    self._changed.wait(None if self._due is None else self._due - self._clock())
                if self._stopped:
                    return
            self.render_ahead()
