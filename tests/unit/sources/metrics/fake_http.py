"""Fake Prometheus servers for the source's tests: an ``httpx.MockTransport`` handler's helpers, and
a local HTTP server (quiet handlers, JSON replies, start/stop) for what needs real sockets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import httpx


def range_selector(query: str) -> bool:
    """A plain range selector (``{...}[120s]``): the raw-sample read, answered with a matrix."""
    return query.startswith("{") and query.endswith("s]")


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that does not log each request to stderr."""

    def log_message(self, *args: object) -> None:
        pass

    def reply_json(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], **attributes: Any) -> Iterator[ThreadingHTTPServer]:
    """The server on a free local port, with ``attributes`` set on it for the handler to read."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()


def form(request: httpx.Request) -> dict[str, list[str]]:
    """The form a query POST carries (``query``, ``time``)."""
    return parse_qs(request.read().decode())


def json_answer(body: bytes, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=body, headers={"Content-Type": "application/json"})
