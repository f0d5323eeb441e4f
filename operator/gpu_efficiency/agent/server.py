"""The agent's HTTP endpoints on one stdlib threading server: /metrics, /snapshot, /healthz, /readyz.

The handlers only read the agent's state (no NVML calls), so a slow or frequent scraper cannot disturb
sampling. The stdlib server keeps the agent's footprint small; the traffic is a scrape every few seconds.

Hostile or broken clients are bounded: at most ``max_connections`` handler threads exist at once (the
next connection gets 503 and is closed), and each request must arrive and its answer leave within
``request_timeout_s`` of wall-clock time (a deadline, not a per-read timeout, so a client trickling a
byte a second cannot hold a thread either). With a ``Gate``, /metrics and /snapshot need a bearer token
that RBAC allows to ``get`` the path; /healthz and /readyz stay open for the kubelet's probes.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from gpu_efficiency.agent.auth import Decision, Gate
from gpu_efficiency.agent.exposition import CONTENT_TYPE
from gpu_efficiency.agent.runtime import Agent

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_REQUEST_TIMEOUT_S = 10.0
PROTECTED_PATHS = frozenset({"/metrics", "/snapshot"})
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n"
)
_TEXT = "text/plain; charset=utf-8"


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (all interfaces)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad listen address {listen!r}: use HOST:PORT")
    return host or "0.0.0.0", int(port)


class _DeadlineReader(io.RawIOBase):
    """Socket reads that share one wall-clock deadline per request (``restart`` sets it)."""

    def __init__(self, sock: socket.socket, budget_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._budget = budget_s
        self.deadline = time.monotonic() + budget_s

    def restart(self) -> None:
        self.deadline = time.monotonic() + self._budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    agent: Agent  # set on the subclass made per server
    gate: Gate | None
    request_timeout_s: float
    server_version = "gpu-efficiency-agent"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection, self.request_timeout_s)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.restart()  # keep-alive: the wait for the next request counts against its deadline
        super().handle_one_request()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if self.gate is not None and url.path in PROTECTED_PATHS:
            decision = self.gate.check(self.headers.get("Authorization"), url.path)
            if decision is not Decision.ALLOWED:
                self._reply(decision.value, f"{decision.name.lower()}\n".encode(), _TEXT)
                return
        try:
            if url.path == "/metrics":
                self._reply(200, self.agent.metrics.render(), CONTENT_TYPE)
            elif url.path == "/snapshot":
                body = orjson.dumps(self.agent.snapshot(dict(parse_qsl(url.query))))
                self._reply(200, body, "application/json")
            elif url.path == "/healthz":
                self._reply(200, b"ok\n", _TEXT)
            elif url.path == "/readyz":
                ready, reason = self.agent.readiness()
                self._reply(200 if ready else 503, reason.encode() + b"\n", _TEXT)
            else:
                self._reply(404, b"endpoints: /metrics /snapshot /healthz /readyz\n", _TEXT)
        except ValueError as exc:
            self._reply(400, f"{exc}\n".encode(), _TEXT)

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        # sendall honours the timeout as a total: a client that does not read cannot hold the thread.
        self.connection.settimeout(max(0.1, self._reader.deadline - time.monotonic()))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="gpu-efficiency-agent"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them; over the cap: 503 and close."""

    daemon_threads = True
    request_queue_size = (
        128  # the listen backlog: a burst of connections is accepted and answered, not dropped
    )

    def __init__(self, address: tuple[str, int], handler: type[_Handler], max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self.rejected = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.rejected += 1
            try:
                request.setblocking(False)  # a full send buffer must not stall the accept loop
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or ran out its deadline is routine: a debug line, not a traceback."""
        log.debug("request from %s failed", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class AgentServer:
    """Serves one agent in a daemon thread; ``port`` is the bound port (useful with port 0 in tests)."""

    def __init__(
        self,
        agent: Agent,
        listen: str,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        gate: Gate | None = None,
    ) -> None:
        if max_connections < 1 or request_timeout_s <= 0:
            raise ValueError("max_connections must be at least 1 and request_timeout_s positive")
        handler = type(
            "Handler", (_Handler,), {"agent": agent, "gate": gate, "request_timeout_s": request_timeout_s}
        )
        self._httpd = _BoundedServer(parse_listen(listen), handler, max_connections)
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def rejected(self) -> int:
        """Connections answered 503 because every handler slot was taken."""
        return self._httpd.rejected

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
