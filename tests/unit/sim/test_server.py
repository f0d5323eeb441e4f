"""The HTTP targets: /metrics over a real socket, shards, and the exporter-down modes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.server import MetricsServer
from gpu_efficiency_sim.simulator import Simulator
from tests.unit.sim.helpers import FakeClock, simulator


@pytest.fixture
def served() -> Iterator[tuple[Simulator, FakeClock, MetricsServer]]:
    faults = (
        Fault(FaultKind.EXPORTER_DOWN, at=10.0, duration=5.0, value="503"),
        Fault(FaultKind.EXPORTER_DOWN, at=20.0, duration=5.0, value="refused"),
    )
    sim, clock = simulator(nodes=3, gpus=2, faults=faults)
    server = MetricsServer(sim, max_age=0.0).start()
    yield sim, clock, server
    server.stop()


def hostnames(text: str) -> set[str]:
    return {
        s.labels["Hostname"]
        for family in text_string_to_metric_families(text)
        if family.name == Signal.GPU_UTIL
        for s in family.samples
    }


def test_metrics_are_served_as_text_format(served: tuple[Simulator, FakeClock, MetricsServer]) -> None:
    _, _, server = served
    response = httpx.get(server.url, timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert hostnames(response.text) == {"node-0", "node-1", "node-2"}
    assert httpx.get(f"http://{server.address}/healthz", timeout=5).status_code == 200
    assert httpx.get(f"http://{server.address}/other", timeout=5).status_code == 404


def test_exporter_down_answers_503_then_recovers(served: tuple[Simulator, FakeClock, MetricsServer]) -> None:
    sim, clock, server = served
    clock.at(11.0, sim)
    assert httpx.get(server.url, timeout=5).status_code == 503
    clock.at(16.0, sim)
    assert httpx.get(server.url, timeout=5).status_code == 200


def test_exporter_down_refused_closes_the_port_then_reopens(
    served: tuple[Simulator, FakeClock, MetricsServer],
) -> None:
    sim, clock, server = served
    clock.at(21.0, sim)
    deadline = time.monotonic() + 5
    refused = False
    while time.monotonic() < deadline and not refused:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                time.sleep(0.1)
        except ConnectionRefusedError:
            refused = True
        except ConnectionResetError:  # caught while the socket was closing
            continue
    assert refused
    clock.at(26.0, sim)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail("the target did not come back after the refused window")


def test_shards_split_the_nodes_without_overlap() -> None:
    sim, _ = simulator(nodes=12, gpus=1)
    servers = [MetricsServer(sim, shard=(i, 3)).start() for i in range(3)]
    try:
        seen = [hostnames(httpx.get(s.url, timeout=5).text) for s in servers]
    finally:
        for s in servers:
            s.stop()
    assert set().union(*seen) == {f"node-{i}" for i in range(12)}
    assert sum(len(s) for s in seen) == 12
    assert all(seen), "every shard serves some nodes"


def test_render_cached_reuses_a_frame_within_max_age() -> None:
    sim, clock = simulator(gpus=1)
    first = sim.render_cached(None, max_age=0.5)
    clock.at(0.2, sim)
    assert sim.render_cached(None, max_age=0.5) is first
    clock.at(1.0, sim)
    assert sim.render_cached(None, max_age=0.5) is not first
