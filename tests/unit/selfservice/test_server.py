"""The route table's limits, through a real socket: size, rate, concurrency, methods, headers."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator, Mapping

import pytest

from gpu_efficiency.selfservice.server import Limits, RateLimiter, Reply, SelfServiceServer


@pytest.fixture
def server() -> Iterator[SelfServiceServer]:
    srv = SelfServiceServer(0, host="127.0.0.1", limits=Limits(max_body=100, per_peer_per_minute=5))
    seen: list[bytes] = []

    def echo(headers: Mapping[str, str], body: bytes, remote: str) -> Reply:
        seen.append(body)
        return 200, "text/plain", b"got " + body + b" from " + remote.encode()

    srv.register_post("/echo", echo)
    srv.register_get("/page", lambda headers, query, remote: (200, "text/html", query.encode()))
    srv.start()
    srv.seen = seen  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def request(
    srv: SelfServiceServer, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request(method, path, body=body, headers={"X-Forwarded-For": "203.0.113.9"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def test_routes_answer_with_safe_headers_and_no_cookie(server: SelfServiceServer) -> None:
    status, headers, body = request(server, "POST", "/echo", b"a=1")
    assert status == 200
    assert body == b"got a=1 from 127.0.0.1 (forwarded for 203.0.113.9)"
    assert headers["cache-control"] == "no-store"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    assert "script-src" not in headers["content-security-policy"]
    assert "set-cookie" not in headers
    assert request(server, "GET", "/page?t=x")[2] == b"t=x"


def test_unknown_paths_and_wrong_methods_change_nothing(server: SelfServiceServer) -> None:
    assert request(server, "GET", "/nope")[0] == 404
    assert request(server, "GET", "/echo")[0] == 405
    assert request(server, "POST", "/page", b"x")[0] == 405
    assert server.seen == []  # type: ignore[attr-defined]


def test_a_body_over_the_limit_is_refused_unread(server: SelfServiceServer) -> None:
    assert request(server, "POST", "/echo", b"x" * 101)[0] == 413
    assert server.seen == []  # type: ignore[attr-defined]


def test_a_peer_over_its_rate_is_refused(server: SelfServiceServer) -> None:
    statuses = [request(server, "GET", "/page")[0] for _ in range(7)]
    assert statuses[:5] == [200] * 5
    assert statuses[5:] == [429, 429]


def test_the_bucket_refills_with_time() -> None:
    now = [0.0]
    limiter = RateLimiter(60, clock=lambda: now[0])
    assert all(limiter.allow("a") for _ in range(60))
    assert not limiter.allow("a")
    assert limiter.allow("b")  # per peer
    now[0] += 1.0
    assert limiter.allow("a")
    assert not limiter.allow("a")


def test_more_concurrent_requests_than_allowed_are_told_to_retry() -> None:
    srv = SelfServiceServer(0, host="127.0.0.1", limits=Limits(concurrent=1))
    entered, release = threading.Event(), threading.Event()

    def slow(headers: Mapping[str, str], query: str, remote: str) -> Reply:
        entered.set()
        release.wait(5)
        return 200, "text/plain", b"ok"

    srv.register_get("/slow", slow)
    first = threading.Thread(target=srv.dispatch, args=("GET", "/slow", {}, lambda n: b"", "p1"))
    first.start()
    assert entered.wait(5)
    assert srv.dispatch("GET", "/slow", {}, lambda n: b"", "p2")[0] == 503
    release.set()
    first.join(5)
    srv.stop()


def test_a_post_without_length_is_refused() -> None:
    srv = SelfServiceServer(0, host="127.0.0.1")
    srv.register_post("/x", lambda h, b, r: (200, "text/plain", b))
    assert srv.dispatch("POST", "/x", {}, lambda n: b"", "p")[0] == 411
    assert srv.dispatch("POST", "/x", {"content-length": "-1"}, lambda n: b"", "p")[0] == 413
    srv.stop()
