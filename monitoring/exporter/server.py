"""The HTTP server: /metrics (the text format) and /healthz (JSON), one event loop thread, h11 for the protocol.

/metrics answers in the Prometheus text format 0.0.4 whatever the Accept header prefers: it is what
`promtool check metrics` validates, and prometheus_client's OpenMetrics encoder costs about 40% more CPU per scrape
for what this exporter does not use (exemplars, created timestamps). Prometheus reads either. The body comes from
monitoring/exporter/prerender.py, gzipped when the scraper accepts it; the `Trainstack-Rendered` header says how it
was made (`ahead` of the scrape, or `on-request`).

Why an event loop: once a scrape's body is rendered ahead, its latency is the server's own. http.server with a
pool of threads (what this was) hands each request from the accepting thread to a worker, and on the 2-vCPU CI
machine a server sending a constant body that way answered one request every 0.25 s with a p99 of 8.7 ms; the same
bytes from a single thread took 2.7 ms. Here one thread accepts, reads and answers every connection; only work
that can block (a body rendered on request, the health check) goes to a small pool, so a slow render or a stalled
client never holds up another scrape. Connections stay open between scrapes when the client asks (HTTP/1.1, as
Prometheus does), so a scrape costs no TCP handshake either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import h11

from trainstack.errors import ConfigError, RuntimeFailure
from trainstack.monitoring.exporter.prerender import AheadRenderer
from trainstack.promcompat import TEXT_CONTENT_TYPE, gzip_accepted

log = logging.getLogger(__name__)

INDEX = b"trainstack exporter: /metrics (Prometheus text format), /healthz (JSON)\n"
BLOCKING_THREADS = 4  # renders on request, health checks: Prometheus servers, a probe and a person with curl at once
REQUEST_TIMEOUT_SECONDS = 10.0  # a request begun must arrive, and a response be taken, within this
IDLE_TIMEOUT_SECONDS = 300.0  # a kept-alive connection may wait this long for its next request: any scrape interval
READ_BYTES = 65536

Response = tuple[int, str, bytes, list[tuple[str, str]]]


class MetricsServer:
    def __init__(self, host: str, port: int, metrics: AheadRenderer, health: Callable[[], dict]):
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        except socket.gaierror as error:
            raise ConfigError(f"--host {host!r} is not an address this machine can listen on ({error})") from None
        try:
            self._socket = socket.create_server((host, port), family=family, backlog=128)
        except OSError as error:  # the port is taken, or not ours to open: not a typo in the flags
            raise RuntimeFailure(f"cannot listen on {host}:{port} ({error.strerror}): pick another --port, "
                                 "or stop what is using it") from None
        self.host = host
        self.port = self._socket.getsockname()[1]
        self._metrics = metrics
        self._health = health
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._connections: set[asyncio.Task] = set()
        self._blocking = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="exporter-http-blocking")
        self._thread = threading.Thread(target=self._run, name="exporter-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(REQUEST_TIMEOUT_SECONDS)
        self._socket.close()
        self._blocking.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._connection, sock=self._socket)
        await self._stopping.wait()
        server.close()
        for task in list(self._connections):  # kept-alive connections would otherwise hold the server open
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        connection = h11.Connection(h11.SERVER)
        try:
            while (request := await self._request(connection, reader)) is not None:
                status, content_type, body, headers = await self._respond(request)
                headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers]
                writer.write(connection.send(h11.Response(status_code=status, headers=headers)) +
                             connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage()))
                await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_SECONDS)
                if connection.our_state is h11.MUST_CLOSE:
                    break
                connection.start_next_cycle()
        except h11.RemoteProtocolError as error:
            if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                message = f"bad request: {error}\n".encode()
                writer.write(connection.send(h11.Response(status_code=error.error_status_hint, headers=[
                    ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(message))),
                    ("Connection", "close")])) + connection.send(h11.Data(data=message)) +
                    connection.send(h11.EndOfMessage()))
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            pass  # a client that stalled or went away: its connection only
        finally:
            writer.close()
            self._connections.discard(task)

    async def _request(self, connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
        """The next whole request on the connection (a GET's body, if one is sent, is read and dropped); None when
        the client closed it."""
        request = None
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                begun = request is not None or connection.trailing_data[0]
                data = await asyncio.wait_for(reader.read(READ_BYTES),
                                              REQUEST_TIMEOUT_SECONDS if begun else IDLE_TIMEOUT_SECONDS)
                connection.receive_data(data)
            elif isinstance(event, h11.Request):
                if event.method != b"GET":  # answered before its body: the connection closes after it
                    return event
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _respond(self, request: h11.Request) -> Response:
        if request.method != b"GET":
            return 405, "text/plain; charset=utf-8", b"only GET\n", [("Allow", "GET"), ("Connection", "close")]
        path = request.target.decode("ascii", "replace").split("?", 1)[0]
        try:
            if path == "/metrics":
                return await self._scrape(_header(request, b"accept-encoding"))
            if path == "/healthz":
                # 200 whenever the exporter can answer: NVML being down is reported in the body and in the
                # metrics, not as a failed probe that would restart a container that is doing its job.
                health = await self._loop.run_in_executor(self._blocking, self._health)
                return 200, "application/json", json.dumps(health).encode() + b"\n", []
        except Exception:
            log.exception("answering %s failed", path)
            return 500, "text/plain; charset=utf-8", b"internal error: see the exporter's log\n", []
        return (200 if path == "/" else 404), "text/plain; charset=utf-8", INDEX, []

    async def _scrape(self, accept_encoding: str) -> Response:
        compress = gzip_accepted(accept_encoding)
        body = self._metrics.take_ahead(compress)
        if body is None:
            body = await self._loop.run_in_executor(self._blocking, self._metrics.render_on_request, compress)
        headers = [("Trainstack-Rendered", "ahead" if body.ahead else "on-request")]
        if compress:
            headers.append(("Content-Encoding", "gzip"))
        return 200, TEXT_CONTENT_TYPE, body.encoded(compress), headers


def _header(request: h11.Request, name: bytes) -> str:
    return b", ".join(value for key, value in request.headers if key == name).decode("latin-1")
