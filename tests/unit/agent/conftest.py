"""Shared fixtures: a fake NVML with a few GPUs, and agents served over real HTTP on a free port."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gpu_efficiency.agent.pods import Attributor
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import AgentServer
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend, FakeGpu, fake_uuid

FAST = {
    "interval_s": 0.05,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.2,
    "event_poll_s": 0.05,
    "attribution_interval_s": 0.1,
    "history_s": 5.0,
}


def gpus(n: int = 2, node: str = "node-a") -> list[FakeGpu]:
    return [FakeGpu(index=i, uuid=fake_uuid(node, i)) for i in range(n)]


@pytest.fixture
def make_backend() -> Callable[[int], FakeBackend]:
    """A fake NVML with ``n`` idle H100s (stable UUIDs for node-a)."""
    return lambda n=2: FakeBackend(gpus(n))


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    def wait(predicate: Callable[[], Any], timeout: float = 3.0, step: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(step)
        raise AssertionError(f"condition not met within {timeout}s")

    return wait


@pytest.fixture
def serve(wait_until: Callable[..., Any], http: httpx.Client) -> Iterator[Callable[..., tuple[Agent, str]]]:
    """Start an agent and its HTTP server; returns (agent, base URL) once /readyz says 200 (unless
    ``ready=False``). Stopped after the test."""
    running: list[tuple[Agent, AgentServer]] = []

    def start(
        backend: FakeBackend, attributor: Attributor | None = None, *, ready: bool = True, **config: Any
    ) -> tuple[Agent, str]:
        agent = Agent(backend, AgentConfig(node_name="node-a", **(FAST | config)), attributor)
        server = AgentServer(agent, "127.0.0.1:0")
        server.start()
        agent.start()
        running.append((agent, server))
        url = f"http://127.0.0.1:{server.port}"
        if ready:
            wait_until(lambda: http.get(f"{url}/readyz").status_code == 200)
        return agent, url

    yield start
    for agent, server in running:
        agent.stop()
        server.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as client:
        yield client
