"""The HTTP server: /metrics and /healthz, a WSGI app on the standard library's threaded WSGI server.

/metrics is prometheus_client's own WSGI app (`make_wsgi_app`: `generate_latest`, gzipped when the scraper accepts
it). It answers in the Prometheus text format 0.0.4 whatever the Accept header prefers: that is what
`promtool check metrics` validates, and this exporter uses nothing only OpenMetrics carries (exemplars, created
timestamps); Prometheus reads either. Each request has a thread of its own, so a stalled client holds up no scrape,
and gives up after REQUEST_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from trainstack.errors import ConfigError, RuntimeFailure

log = logging.getLogger(__name__)

INDEX = b"trainstack exporter: /metrics (Prometheus text format), /healthz (JSON)\n"
REQUEST_TIMEOUT_SECONDS = 10.0  # a client must send its request, and take the response, within this
TEXT = "text/plain; charset=utf-8"


class Endpoints:
    """The WSGI app: /metrics from the registry, /healthz from `health`, an index at / and 404 elsewhere."""

    def __init__(self, registry: CollectorRegistry, health: Callable[[], dict]):
        self._metrics = make_wsgi_app(registry)
        self._health = health

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "GET":  # here: make_wsgi_app of 0.20 answers any method
            return _answer(start_response, "405 Method Not Allowed", TEXT, b"only GET\n", [("Allow", "GET")])
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            environ.pop("HTTP_ACCEPT", None)  # the text format, never OpenMetrics (the module's docstring)
            return self._metrics(environ, start_response)
        if path == "/healthz":
            try:
                health = json.dumps(self._health()).encode() + b"\n"
            except Exception:
                log.exception("answering /healthz failed")
                return _answer(
                    start_response, "500 Internal Server Error", TEXT, b"internal error: see the exporter's log\n"
                )
            # 200 whenever the exporter can answer: NVML being down is reported in the body and in the metrics,
            # not as a failed probe that would restart a container that is doing its job.
            return _answer(start_response, "200 OK", "application/json", health)
        return _answer(start_response, "200 OK" if path == "/" else "404 Not Found", TEXT, INDEX)


def _answer(
    start_response: Callable, status: str, content_type: str, body: bytes, headers: Sequence[tuple[str, str]] = ()
) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers])
    return [body]


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_SECONDS

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the standard library's name)
        """One line a request on stderr is noise for an endpoint scraped every few seconds."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request thread stuck on a stalled client must not keep the process alive

    def handle_error(self, request, client_address) -> None:
        """A client that stalled past the timeout or went away: its connection only, not worth a traceback."""
        log.debug("request from %s failed", client_address, exc_info=True)


class MetricsServer:
    def __init__(self, host: str, port: int, app: Endpoints):
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        except socket.gaierror as error:
            raise ConfigError(f"--host {host!r} is not an address this machine can listen on ({error})") from None
        server_class = type("MetricsHTTPServer", (_ThreadingServer,), {"address_family": family})
        try:
            self._server = server_class((host, port), _QuietHandler)
        except OSError as error:  # the port is taken, or not ours to open: not a typo in the flags
            raise RuntimeFailure(
                f"cannot listen on {host}:{port} ({error.strerror}): pick another port (the exporter's --port; "
                "train's and watch's --exporter-port), or stop what is using it"
            ) from None
        self._server.set_app(app)
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="exporter-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
