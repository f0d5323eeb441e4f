"""HTTP targets serving the simulator's /metrics, and playing the exporter-down faults.

One ``MetricsServer`` per target: each serves one shard of the nodes, so a 1,000-node fleet can be
scraped as one big target or as many small ones. ``exporter-down`` faults answer 503, hang past the
scrape timeout, or close the listening socket (connection refused) and reopen it afterwards.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_efficiency_sim.exposition import CONTENT_TYPE
from gpu_efficiency_sim.faults import ExporterDown, Fault
from gpu_efficiency_sim.simulator import Shard, Simulator

log = logging.getLogger(__name__)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    target: MetricsServer


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        target = self.server.target
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
            return
        if path != "/metrics":
            self._send(404, b"see /metrics\n", "text/plain")
            return
        fault = target.sim.down()
        if fault is not None:
            self._down(fault)
            return
        self._send(200, target.body(), CONTENT_TYPE)

    def _down(self, fault: Fault) -> None:
        mode = ExporterDown(str(fault.value or ExporterDown.HTTP_503))
        if mode is ExporterDown.HANG:
            end = self.server.target.sim.elapsed() + 30.0
            while self.server.target.sim.down() is fault and self.server.target.sim.elapsed() < end:
                time.sleep(0.1)
            self.close_connection = True
            return
        self._send(503, b"dcgm-exporter down (simulated fault)\n", "text/plain")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's signature
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer:
    """One scrape target: a shard of the simulator on host:port."""

    def __init__(
        self,
        sim: Simulator,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        shard: Shard | None = None,
        max_age: float = 0.5,
        prerender_s: float | None = None,
    ) -> None:
        """``prerender_s``: render a frame every this many seconds in the background and answer scrapes
        with the latest one (as dcgm-exporter serves values it collected earlier); scrapes then never
        wait for rendering, which matters for thousands of GPUs. Default: render on demand, shared by
        the scrapes of ``max_age`` seconds."""
        self.sim = sim
        self.shard = shard
        self.max_age = max_age
        self.prerender_s = prerender_s
        self._frame: bytes | None = None
        self._frame_ready = threading.Event()
        self._host = host
        self._httpd = self._bind(host, port)
        self.port = int(self._httpd.server_address[1])
        self._serving: threading.Thread | None = None
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    def _bind(self, host: str, port: int) -> _HTTPServer:
        httpd = _HTTPServer((host, port), _Handler)
        httpd.target = self
        return httpd

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def body(self) -> bytes:
        """The bytes of the current frame."""
        if self.prerender_s is None:
            return self.sim.render_cached(self.shard, self.max_age).encode()
        self._frame_ready.wait(30)
        return self._frame or b""

    def _prerender(self) -> None:
        assert self.prerender_s is not None
        while not self._stop.is_set():
            started = time.monotonic()
            self._frame = self.sim.render(self.shard).encode()
            self._frame_ready.set()
            self._stop.wait(max(0.0, self.prerender_s - (time.monotonic() - started)))

    def start(self) -> MetricsServer:
        if self.prerender_s is not None:
            threading.Thread(target=self._prerender, name=f"sim-render-{self.port}", daemon=True).start()
        self._serve()
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"sim-supervisor-{self.port}", daemon=True
        )
        self._supervisor.start()
        return self

    def _serve(self) -> None:
        self._serving = threading.Thread(
            target=self._httpd.serve_forever, name=f"sim-http-{self.port}", daemon=True
        )
        self._serving.start()

    def _supervise(self) -> None:
        """Close the socket while a ``refused`` exporter-down fault lasts; reopen it after."""
        closed = False
        while not self._stop.wait(0.1):
            fault = self.sim.down()
            refused = fault is not None and str(fault.value) == ExporterDown.REFUSED
            if refused and not closed:
                log.info("exporter-down fault: closing %s", self.address)
                self._httpd.shutdown()
                self._httpd.server_close()
                closed = True
            elif not refused and closed:
                log.info("exporter-down fault over: reopening %s", self.address)
                self._httpd = self._bind(self._host, self.port)
                self._serve()
                closed = False

    def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        try:
            self._httpd.shutdown()
        finally:
            self._httpd.server_close()
