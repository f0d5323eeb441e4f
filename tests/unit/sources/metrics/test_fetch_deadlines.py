"""A Prometheus query and a node agent's snapshot end by their wall-clock deadline, body included.

The servers here trickle their answer a byte every 0.2 s: every read is well inside any socket
timeout, so only a deadline on the whole exchange ends it (before: 63 bytes took 12.6 s).
"""

from __future__ import annotations

import time

import pytest
from tests.unit.sources.metrics.slow_http import slow_server

from gpu_efficiency.engine.model import Window
from gpu_efficiency.sources.metrics.agent import AgentSource
from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.deadline import Watchdog
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.promql import Query

DEADLINE = 1.0
SLACK = 1.0  # thread start-up and a loaded CI machine


@pytest.mark.parametrize("gap", [0.2, None], ids=["trickled body", "no answer"])
def test_a_prometheus_query_ends_by_its_deadline(gap: float | None) -> None:
    with slow_server(gap) as url:
        source = PrometheusSource(PrometheusConfig(url=url, timeout=DEADLINE, retries=0))
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match="did not answer within 1s"):
            source.query("up")
        assert time.monotonic() - started < DEADLINE + SLACK


def test_a_streamed_window_query_ends_by_its_deadline() -> None:
    with slow_server(0.2) as url:
        source = PrometheusSource(PrometheusConfig(url=url, timeout=DEADLINE, retries=0))
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match="did not answer within 1s"):
            source.window_values(Query(window=Window.ACTIVITY, text="up"), at=1000.0)
        assert time.monotonic() - started < DEADLINE + SLACK


def test_a_prompt_answer_is_read_whole() -> None:
    with slow_server(0.0) as url:
        source = PrometheusSource(PrometheusConfig(url=url, timeout=DEADLINE, retries=0))
        assert source.query("up") == []


def test_a_trickling_agent_ends_by_its_deadline() -> None:
    with slow_server(0.2) as slow:
        source = AgentSource([slow], timeout_s=DEADLINE)
        started = time.monotonic()
        samples, error = source._one(
            source._discover()[0],
            "history=0",
            {Window.ACTIVITY: 60.0},
            {},
        )
        assert samples == []
        assert "within 1s" in error
        assert time.monotonic() - started < DEADLINE + SLACK


def test_the_watchdog_calls_only_what_is_still_armed() -> None:
    dog = Watchdog()
    called: list[str] = []
    now = time.monotonic()
    dog.arm(now + 0.05, lambda: called.append("late"))
    token = dog.arm(now + 0.01, lambda: called.append("disarmed"))
    dog.disarm(token)
    dog.arm(now + 0.02, lambda: called.append("early"))
    time.sleep(0.3)
    assert called == ["early", "late"]
