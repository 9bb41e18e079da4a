"""A thin HTTP server: /metrics (the text format, from the registry's collectors) and /healthz (JSON).

/metrics answers in the Prometheus text format 0.0.4 whatever the Accept header prefers: it is what
`promtool check metrics` validates, and prometheus_client's OpenMetrics encoder costs about 40% more CPU per scrape
for what this exporter does not use (exemplars, created timestamps). Prometheus reads either. The body is gzipped
at level 1 when the scraper accepts it: ~20% larger than level 9 (5 KiB for 8 GPUs and 8 ranks) at a fourteenth
of the CPU (0.07 ms instead of 1 ms).

Requests are served by a small pool of threads started once: a thread per request (what wsgiref's threading
server does) costs a thread start each scrape and, on a busy host, waits for the scheduler to run it, which made
up most of the scrape's tail latency (bench/scrape_cost.py). A client that stalls holds one pool thread for at most
REQUEST_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

from prometheus_client import CollectorRegistry

from monitoring.exporter.exposition import TextEncoder
from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.promcompat import TEXT_CONTENT_TYPE, gzip_accepted

INDEX = b"trainstack exporter: /metrics (Prometheus text format), /healthz (JSON)\n"
GZIP_LEVEL = 1
POOL_THREADS = 4  # Prometheus servers, a probe and a person with curl at once; each scrape takes a few ms
REQUEST_TIMEOUT_SECONDS = 10.0

Response = tuple[int, str, bytes, list[tuple[str, str]]]


def make_app(registry: CollectorRegistry, health: Callable[[], dict]) -> Callable[[str, str], Response]:
    """path, Accept-Encoding -> (status, content type, body, extra headers)."""
    encoder = TextEncoder()

    def app(path: str, accept_encoding: str) -> Response:
        if path == "/metrics":
            body = encoder.encode(registry)
            if gzip_accepted(accept_encoding):
                return 200, TEXT_CONTENT_TYPE, gzip.compress(body, compresslevel=GZIP_LEVEL), [
                    ("Content-Encoding", "gzip")]
            return 200, TEXT_CONTENT_TYPE, body, []
        if path == "/healthz":
            # 200 whenever the exporter can answer: NVML being down is reported in the body and in the metrics,
            # not as a failed probe that would restart a container that is doing its job.
            return 200, "application/json", json.dumps(health()).encode() + b"\n", []
        return (200 if path == "/" else 404), "text/plain; charset=utf-8", INDEX, []

    return app


def _handler_for(app: Callable[[str, str], Response]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_SECONDS

        def do_GET(self) -> None:
            status, content_type, body, headers = app(self.path.split("?", 1)[0],
                                                      self.headers.get("Accept-Encoding", ""))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:
            """A request line per scrape would drown the exporter's log."""

    return Handler


class _PooledHTTPServer(HTTPServer):
    def __init__(self, address, handler, address_family: int):
        self.address_family = address_family
        self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="exporter-http")
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        self._pool.submit(self._serve, request, client_address)

    def _serve(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class MetricsServer:
    def __init__(self, host: str, port: int, app: Callable[[str, str], Response]):
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        except socket.gaierror as error:
            raise ConfigError(f"--host {host!r} is not an address this machine can listen on ({error})") from None
        try:
            self._server = _PooledHTTPServer((host, port), _handler_for(app), family)
        except OSError as error:  # the port is taken, or not ours to open: not a typo in the flags
            raise RuntimeFailure(f"cannot listen on {host}:{port} ({error.strerror}): pick another --port, "
                                 "or stop what is using it") from None
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="exporter-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever(), so only after start()
            self._server.shutdown()
        self._server.server_close()
