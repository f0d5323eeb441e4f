"""The simulator's pod watcher stops at once, even while its watch stream is silent.

A scenario without pod changes (fault scenarios have no workloads) leaves the watch blocked in a
read; closing the response alone waited for that read, i.e. for the server to end the watch (up to
the watch timeout, ~60 s per scenario run).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from gpu_efficiency_sim.kube import PodWatcher


class _SilentApiServer(BaseHTTPRequestHandler):
    """Lists no pods, then holds every watch open without sending an event."""

    protocol_version = "HTTP/1.1"
    watches = 0

    def do_GET(self) -> None:
        if "watch=true" in self.path:
            type(self).watches += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and not self.server.closing:  # type: ignore[attr-defined]
                time.sleep(0.05)
            return
        body = json.dumps({"kind": "PodList", "items": [], "metadata": {"resourceVersion": "7"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SilentApiServer)
    server.daemon_threads = True
    server.closing = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield client.ApiClient(config)
    finally:
        server.closing = True  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def test_stop_returns_promptly_while_the_watch_is_silent(api: client.ApiClient) -> None:
    watcher = PodWatcher(api, lambda pods: None).start()
    assert watcher.wait_synced(10)
    deadline = time.monotonic() + 10
    while _SilentApiServer.watches == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the watch thread is now blocked reading the silent stream
    started = time.monotonic()
    watcher.stop()
    took = time.monotonic() - started
    assert took < 2.0, f"stop() took {took:.1f}s"
