"""The one way the tests read an exporter's /metrics, and the shapes they read it in."""

from __future__ import annotations

import contextlib
import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from trainstack.monitoring.diagnose.snapshot import read_snapshot
from trainstack.monitoring.diagnose.sources import open_source
from trainstack.monitoring.diagnose.verdicts import Verdict, diagnose
from trainstack.thresholds import Thresholds


def scrape(target: str | int) -> list[Sample] | None:
    """One scrape of `target` (a /metrics URL, or a port on loopback): its samples, or None while nothing answers."""
    url = target if isinstance(target, str) else f"http://127.0.0.1:{target}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def per_rank(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """sample name -> rank -> value."""
    values: dict[str, dict[str, float]] = {}
    for sample in samples:
        values.setdefault(sample.name, {})[sample.labels.get("rank", "")] = sample.value
    return values


def by_labels(samples: list[Sample] | None) -> dict[tuple[str, frozenset], float] | None:
    """(sample name, labels) -> value; None while nothing answered."""
    if samples is None:
        return None
    return {(s.name, frozenset(s.labels.items())): s.value for s in samples}


def diagnose_url(url: str, interval: float = 4.0, **limits) -> list[Verdict]:
    """diagnose's verdicts on a live exporter's /metrics over `interval` seconds."""
    return diagnose(read_snapshot(open_source(url, "auto", interval, "")), Thresholds(**limits))


@contextlib.contextmanager
def served_metrics(text: str, once: bool = False) -> Iterator[str]:
    """An exporter in a thread that serves `text` as its /metrics (404 elsewhere: no Prometheus API), on a free
    loopback port; yields its /metrics URL. `once`: it stops listening after its first scrape, as the exporter of a
    run that ends right then."""

    class Served(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if once:
                threading.Thread(target=lambda: (self.server.shutdown(), self.server.server_close())).start()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        if not once:
            server.shutdown()
            server.server_close()
