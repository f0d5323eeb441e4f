"""A local HTTP server for the Prometheus source's tests: quiet handlers, JSON replies, start/stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
