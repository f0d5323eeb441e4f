"""Local HTTP servers that misbehave slowly, for deadline tests: one answers nothing, one trickles.

A trickling server sends its headers at once and then its body one byte at a time, each byte well
inside any per-read socket timeout, so only a wall-clock deadline ends the exchange.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

from tests.unit.sources.metrics.fake_http import QuietHandler, serving

VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


class SlowHandler(QuietHandler):
    server: SlowServer

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._exchange()

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self._exchange()

    def _exchange(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.server.gap is None:  # hang: answer nothing until the test ends
            self.server.stop.wait()
            return
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        for i in range(len(body)):
            if self.server.stop.wait(self.server.gap):
                return
            try:
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
            except OSError:
                return  # the client gave up: what a deadline should make it do


class SlowServer(ThreadingHTTPServer):
    gap: float | None
    body: bytes
    stop: threading.Event


@contextmanager
def slow_server(gap: float | None, body: bytes = VECTOR) -> Iterator[str]:
    """The base URL of a server that hangs (``gap`` None) or trickles ``body`` a byte per ``gap`` s."""
    stop = threading.Event()
    with serving(SlowHandler, gap=gap, body=body, stop=stop) as server:
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            stop.set()
