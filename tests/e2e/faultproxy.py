"""A fault-injecting HTTP reverse proxy for e2e tests (issue 19's chaos suite).

It sits between the operator and the real kube-apiserver (TLS upstream, plain http to the
operator, the operator's own ServiceAccount token passed through) or any plain-http server
(``Upstream("http", host, port)``: Prometheus), forwards every request, streams chunked answers
(watches) as they come, and injects faults by rule: a rule matches a method and a path regex on a
schedule (the first N matches, every Kth, or a time window) and answers an error status, holds the
request, trickles the body, drops a watch stream mid-way or ends it with a 410 Gone, or lets the
server apply a write and answers the client an error all the same (a gateway's 504 after the commit). Every
injection is counted, so a test can say which faults really happened.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Fault(StrEnum):
    STATUS = "status"  # answer `status` (500, 429 with Retry-After, 409...) without forwarding
    HANG = "hang"  # hold the request `seconds`, then close the connection unanswered
    TRICKLE = "trickle"  # forward, then send the answer a few bytes every `seconds`
    DROP = "drop"  # forward a (watch) stream, close the connection `seconds` into it
    GONE = "gone"  # answer a watch with one ERROR event carrying 410 Gone, then end it
    COMMIT = "commit"  # forward and let the server apply it, then answer `status` (504) instead


@dataclass
class Rule:
    """Inject ``fault`` into requests of ``method`` (``*``: any) whose path and query match ``path``.

    Schedule: the first ``first`` matches, or every ``every``-th match, or every match while the
    proxy's clock is in ``window`` (seconds since ``FaultProxy.arm``); none of them: every match."""

    method: str
    path: str
    fault: Fault
    status: int = 500
    seconds: float = 0.0
    retry_after: int = 1
    first: int | None = None
    every: int | None = None
    window: tuple[float, float] | None = None
    matched: int = 0
    injected: int = 0
    #: COMMIT only: what the API server answered each forwarded request (the client saw `status`)
    upstream: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path)

    def fires(self, method: str, path: str, now: float) -> bool:
        if self.method not in ("*", method) or not self._pattern.search(path):
            return False
        self.matched += 1
        if self.first is not None:
            fire = self.matched <= self.first
        elif self.every is not None:
            fire = self.matched % self.every == 0
        elif self.window is not None:
            fire = self.window[0] <= now < self.window[1]
        else:
            fire = True
        if fire:
            self.injected += 1
        return fire

    def describe(self) -> str:
        what = {Fault.STATUS: f"{self.status}", Fault.COMMIT: f"commit then {self.status}"}.get(
            self.fault, str(self.fault)
        )
        return f"{what} on {self.method} {self.path}"


@dataclass
class Upstream:
    scheme: str
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.ssl_context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass
class FaultProxy:
    """``FaultProxy(upstream).start()``; ``url`` is where to point the client; ``rules`` may change
    while it runs (under ``lock``)."""

    upstream: Upstream
    rules: list[Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    seen: Counter[str] = field(default_factory=Counter)  # "METHOD path" (query cut), for failures
    last_injection: float = 0.0  # monotonic time of the last fault injected
    kubeconfig: str = ""  # for an API server upstream: a kubeconfig that talks to the proxy
    _t0: float = field(default_factory=time.monotonic)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def arm(self, rules: list[Rule]) -> None:
        """Replace the rules and restart the clock their windows count from."""
        with self.lock:
            self.rules = rules
            self._t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def injected(self) -> dict[str, int]:
        with self.lock:
            return {r.describe(): r.injected for r in self.rules}

    def pick(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.requests += 1
            self.seen[f"{method} {path.split('?', 1)[0]}{' (watch)' if 'watch=' in path else ''}"] += 1
            now = self.elapsed()
            for rule in self.rules:
                if rule.fires(method, path, now):
                    self.last_injection = time.monotonic()
                    return rule
        return None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        rule = self.owner.pick(self.command, self.path)
        if rule is not None and rule.fault is Fault.STATUS:
            self._status(rule)
            return
        if rule is not None and rule.fault is Fault.COMMIT:
            self._commit_then_status(body, rule)
            return
        if rule is not None and rule.fault is Fault.HANG:
            time.sleep(rule.seconds)
            self.close_connection = True
            return
        if rule is not None and rule.fault is Fault.GONE and "watch=" in self.path:
            self._gone()
            return
        self._forward(body, rule)

    def _commit_then_status(self, body: bytes | None, rule: Rule) -> None:
        """The request reaches the API server, which applies it; its answer is thrown away and the
        client gets ``rule.status`` (a gateway timing out after the commit)."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        with contextlib.suppress(OSError):
            upstream = self.owner.upstream.connect(timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                response.read()
                with self.owner.lock:
                    rule.upstream[response.status] += 1
            finally:
                upstream.close()
        self._status(rule)

    def _status(self, rule: Rule) -> None:
        reasons = {
            409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
            504: "Timeout",
        }  # fmt: skip
        payload = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"injected by the fault proxy: {rule.status}",
                "reason": reasons.get(rule.status, "InternalError"),
                "code": rule.status,
            }
        ).encode()
        self.send_response(rule.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if rule.status == 429:
            self.send_header("Retry-After", str(rule.retry_after))
        self.end_headers()
        self.wfile.write(payload)

    def _gone(self) -> None:
        event = {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": "too old resource version (injected by the fault proxy)",
                "reason": "Expired",
                "code": 410,
            },
        }
        payload = json.dumps(event).encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(payload)
        self._chunk(b"")
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _forward(self, body: bytes | None, rule: Rule | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        try:
            upstream = self.owner.upstream.connect(timeout=600)
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
        except OSError:
            self.send_error(502, "upstream unreachable")
            self.close_connection = True
            return
        try:
            self._relay(response, rule)
        except OSError:  # the client went away, or we dropped the stream on purpose
            self.close_connection = True
        finally:
            upstream.close()

    def _relay(self, response: http.client.HTTPResponse, rule: Rule | None) -> None:
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(key, value)
        if self.command == "HEAD" or response.status in (204, 304):
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        started = time.monotonic()
        while True:
            if rule is not None and rule.fault is Fault.DROP and time.monotonic() - started >= rule.seconds:
                self._abort()
                return
            data = response.read1(16 if rule is not None and rule.fault is Fault.TRICKLE else 65536)
            if not data:
                break
            self._chunk(data)
            if rule is not None and rule.fault is Fault.TRICKLE:
                time.sleep(rule.seconds)
        self._chunk(b"")

    def _abort(self) -> None:
        """Close the client's connection without ending the chunked stream: a dropped watch."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def apiserver_upstream(kubeconfig: str) -> Upstream:
    """The API server of ``kubeconfig``'s current cluster, trusted through its CA."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = config["clusters"][0]["cluster"]
    parts = urlsplit(cluster["server"])
    context = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=cluster["certificate-authority"])
    assert parts.hostname, cluster["server"]
    assert parts.port, cluster["server"]
    return Upstream("https", parts.hostname, parts.port, context)


def proxied_kubeconfig(kubeconfig: str, proxy_url: str, directory: Path | None = None) -> str:
    """A copy of ``kubeconfig`` (its token user) that talks plain http to the proxy."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    for entry in config["clusters"]:
        entry["cluster"] = {"server": proxy_url}
    out = Path(tempfile.mkdtemp(dir=directory)) / "kubeconfig-via-proxy"
    out.write_text(yaml.safe_dump(config))
    return str(out)
