"""The agent's HTTP endpoints on one stdlib threading server: /metrics, /snapshot, /healthz, /readyz.

The handlers only read the agent's state (no NVML calls), so a slow or frequent scraper cannot disturb
sampling. The stdlib server keeps the agent's footprint small; the traffic is a scrape every few seconds.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import orjson

from gpu_efficiency.agent.exposition import CONTENT_TYPE
from gpu_efficiency.agent.runtime import Agent

log = logging.getLogger(__name__)


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (all interfaces)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad listen address {listen!r}: use HOST:PORT")
    return host or "0.0.0.0", int(port)


class _Handler(BaseHTTPRequestHandler):
    agent: Agent  # set on the subclass made per server
    server_version = "gpu-efficiency-agent"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/metrics":
                self._reply(200, self.agent.metrics.render(), CONTENT_TYPE)
            elif url.path == "/snapshot":
                body = orjson.dumps(self.agent.snapshot(dict(parse_qsl(url.query))))
                self._reply(200, body, "application/json")
            elif url.path == "/healthz":
                self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            elif url.path == "/readyz":
                ready, reason = self.agent.readiness()
                self._reply(200 if ready else 503, reason.encode() + b"\n", "text/plain; charset=utf-8")
            else:
                self._reply(
                    404, b"endpoints: /metrics /snapshot /healthz /readyz\n", "text/plain; charset=utf-8"
                )
        except ValueError as exc:
            self._reply(400, f"{exc}\n".encode(), "text/plain; charset=utf-8")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class AgentServer:
    """Serves one agent in a daemon thread; ``port`` is the bound port (useful with port 0 in tests)."""

    def __init__(self, agent: Agent, listen: str) -> None:
        handler = type("Handler", (_Handler,), {"agent": agent})
        self._httpd = ThreadingHTTPServer(parse_listen(listen), handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
