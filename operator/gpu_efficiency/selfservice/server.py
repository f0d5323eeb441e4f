"""The self-service HTTP server: a small route table behind request-size, rate, concurrency and time
limits. It runs in every replica (leader and standby); what a route may write is the route's
business (clicks.py writes only in the leader).

Interface (stable; the Slack handler registers itself the same way)::

    server = SelfServiceServer(port=8082)
    server.register_post("/slack/actions", handler)   # handler(headers, body, remote) -> Reply
    server.register_get("/gpu", page)                 # page(headers, query, remote) -> Reply
    server.start(); ...; server.stop()

``Reply`` is ``(status, content_type, body_bytes)``; ``headers`` have lower-case names; ``remote``
is the peer's address (plus ``X-Forwarded-For`` in parentheses when a proxy sent one: shown in
events, never trusted for limits). A body over ``Limits.max_body`` is refused (413) unread, a
peer over its rate gets 429, more concurrent requests than ``Limits.concurrent`` get 503, and a
socket idle for ``Limits.socket_timeout_s`` is closed. No cookies are read or set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Reply = tuple[int, str, bytes]
PostHandler = Callable[[Mapping[str, str], bytes, str], Reply]
GetHandler = Callable[[Mapping[str, str], str, str], Reply]

TEXT = "text/plain; charset=utf-8"
#: Every answer: no caching of pages holding tokens, no framing (clickjacking), no referrer leak of the
#: token to other sites, and no script or style from anywhere but the page itself.
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_body: int = 64 * 1024  # Slack's interaction payloads stay far below this
    per_peer_per_minute: int = 60
    concurrent: int = 8
    socket_timeout_s: float = 10.0


class RateLimiter:
    """A token bucket per peer address: ``per_minute`` requests, refilled continuously."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, peer: str) -> bool:
        now = self.clock()
        with self._lock:
            if len(self._buckets) > 10_000:  # forget the idle peers rather than grow without bound
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
            tokens, at = self._buckets.get(peer, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.rate)
            if tokens < 1:
                self._buckets[peer] = (tokens, now)
                return False
            self._buckets[peer] = (tokens - 1, now)
            return True


class SelfServiceServer:
    """See the module docstring."""

    def __init__(self, port: int, *, host: str = "0.0.0.0", limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.post_routes: dict[str, PostHandler] = {}
        self.get_routes: dict[str, GetHandler] = {}
        self.rate = RateLimiter(self.limits.per_peer_per_minute)
        self._slots = threading.BoundedSemaphore(self.limits.concurrent)
        self._httpd = ThreadingHTTPServer((host, port), _handler_class(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def register_post(self, path: str, handler: PostHandler) -> None:
        self.post_routes[path] = handler

    def register_get(self, path: str, handler: GetHandler) -> None:
        self.get_routes[path] = handler

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="selfservice-http", daemon=True
        )
        self._thread.start()
        log.info("self-service page listening on port %d", self.port)

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: never call it unstarted
            self._httpd.shutdown()
            self._thread = None
        self._httpd.server_close()

    def dispatch(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        read_body: Callable[[int], bytes],
        peer: str,
    ) -> Reply:
        """One request through the limits and the route table (the HTTP handler's whole work)."""
        parts = urlsplit(target)
        routes: Mapping[str, object] = self.post_routes if method == "POST" else self.get_routes
        if parts.path not in routes:
            known = parts.path in self.post_routes or parts.path in self.get_routes
            return (405, TEXT, b"method not allowed\n") if known else (404, TEXT, b"not found\n")
        if not self.rate.allow(peer):
            return 429, TEXT, b"too many requests: wait a minute and try again\n"
        if not self._slots.acquire(blocking=False):
            return 503, TEXT, b"busy: try again in a few seconds\n"
        try:
            forwarded = headers.get("x-forwarded-for", "").strip()
            remote = f"{peer} (forwarded for {forwarded[:100]})" if forwarded else peer
            if method == "POST":
                try:
                    length = int(headers.get("content-length", ""))
                except ValueError:
                    return 411, TEXT, b"a POST needs a Content-Length\n"
                if length < 0 or length > self.limits.max_body:
                    return 413, TEXT, b"request too large\n"
                return self.post_routes[parts.path](headers, read_body(length), remote)
            return self.get_routes[parts.path](headers, parts.query, remote)
        except Exception:
            log.exception("self-service %s %s failed", method, parts.path)
            return 500, TEXT, b"internal error: nothing was changed\n"
        finally:
            self._slots.release()


def _handler_class(server: SelfServiceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = server.limits.socket_timeout_s
        server_version = "gpu-efficiency-selfservice"
        sys_version = ""

        def _serve(self, method: str) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, content_type, body = server.dispatch(
                method, self.path, headers, self.rfile.read, self.client_address[0]
            )
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in SECURITY_HEADERS:
                self.send_header(name, value)
            if status == 413:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: object) -> None:
            log.debug("self-service %s: " + format, self.client_address[0], *args)

    return Handler
