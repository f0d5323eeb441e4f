"""The agent's HTTP server against hostile clients, over real sockets on 127.0.0.1: half-sent and
trickled requests time out on a wall-clock deadline, handler threads never exceed the cap (503 past it),
and a good request is still answered."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import AgentServer
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend
from tests.unit.agent.conftest import FAST, gpus

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: agent\r\n"  # no blank line: the request never ends


@pytest.fixture
def agent() -> Agent:
    return Agent(FakeBackend(gpus(1)), AgentConfig(node_name="node-a", **FAST))


@pytest.fixture
def start(agent: Agent) -> Iterator[Callable[..., AgentServer]]:
    servers: list[AgentServer] = []

    def run(*, max_connections: int, request_timeout_s: float) -> AgentServer:
        server = AgentServer(
            agent, "127.0.0.1:0", max_connections=max_connections, request_timeout_s=request_timeout_s
        )
        server.start()
        servers.append(server)
        return server

    yield run
    for s in servers:
        s.stop()


def _connect(port: int, payload: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(payload)
    return s


def _get(port: int, path: str = "/healthz") -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


def test_300_half_sent_requests_keep_threads_bounded_and_a_good_request_is_answered(
    start: Callable[..., AgentServer],
) -> None:
    server = start(max_connections=8, request_timeout_s=1.0)
    before = threading.active_count()
    held = [_connect(server.port, HALF_SENT) for _ in range(300)]
    try:
        time.sleep(0.3)
        assert threading.active_count() - before <= 8
        assert server.rejected > 0
        # The slots free up when the half-sent requests pass their deadline; then good requests get through.
        deadline = time.monotonic() + 5
        status = _get(server.port).status_code
        while status != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            status = _get(server.port).status_code
        assert status == 200
        assert threading.active_count() - before <= 8
    finally:
        for s in held:
            s.close()


def test_a_connection_over_the_cap_gets_503_and_is_closed(start: Callable[..., AgentServer]) -> None:
    server = start(max_connections=2, request_timeout_s=5.0)
    held = [_connect(server.port, HALF_SENT) for _ in range(2)]
    try:
        time.sleep(0.2)
        response = _get(server.port)
        assert response.status_code == 503
        assert response.headers["connection"] == "close"
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)  # the handlers see EOF and give their slots back
    assert _get(server.port).status_code == 200


def test_a_trickling_client_is_cut_off_at_the_deadline_not_per_read(
    start: Callable[..., AgentServer],
) -> None:
    server = start(max_connections=4, request_timeout_s=1.0)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    started = time.monotonic()
    closed_after = None
    try:
        for byte in HALF_SENT * 10:  # one byte every 0.1 s: each read is quick, the whole is not
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
            time.sleep(0.1)
            s.setblocking(False)
            try:
                if s.recv(1024) == b"":
                    closed_after = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed_after = time.monotonic() - started
                break
            finally:
                s.setblocking(True)
    finally:
        s.close()
    assert closed_after is not None
    assert closed_after < 3.0


def test_an_idle_keep_alive_connection_gives_its_thread_back(start: Callable[..., AgentServer]) -> None:
    server = start(max_connections=1, request_timeout_s=0.5)
    with httpx.Client(timeout=5) as client:
        assert client.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200  # kept alive
        time.sleep(1.0)
        assert _get(server.port).status_code == 200  # the only slot was freed by the deadline


@pytest.mark.parametrize("kwargs", [{"max_connections": 0}, {"request_timeout_s": 0.0}])
def test_bad_limits_are_refused(agent: Agent, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="max_connections"):
        AgentServer(agent, "127.0.0.1:0", **kwargs)  # type: ignore[arg-type]
