"""Every query the Prometheus source sends fits VictoriaMetrics' default ``-search.maxQueryLen``
(``MAX_QUERY_BYTES``) at 8,000 GPUs, whatever the fault candidates and held nodes; a refused query
and a partial answer are SourceUnavailable naming why (issue 35)."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from tests.unit.runtime.cycle_harness import OneSource
from tests.unit.runtime.test_source_failure import _Reader

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import PolicyEvent, Window
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.sources.metrics.base import FaultHints, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import (
    PrometheusConfig,
    PrometheusSource,
    exporter_inventory,
    xid_counts,
)
from gpu_efficiency.sources.metrics.prometheus.promql import (
    FILTERED_WINDOWS,
    MAX_QUERY_BYTES,
    MAX_WINDOW_PARTS,
    QUERY_PLAN,
    candidates_query,
    cycle_queries,
    identity_query,
    idle_candidates_query,
    restricted_queries,
)
from gpu_efficiency.sources.metrics.prometheus.vector import decode_vector, iter_vector
from gpu_efficiency.sources.metrics.prometheus.windows import TrustedRows, merge_window

WINDOWS = {
    Window.ACTIVITY: 3600.0,
    Window.FAULT: 900.0,
    Window.THERMAL_HOLD: 300.0,
    Window.THERMAL_RECOVERY: 600.0,
}
GPUS = 8000
MATCHERS = 'job="nvidia-dcgm-exporter",namespace="gpu-operator"'


def _uuids(count: int) -> list[str]:
    rng = random.Random(35)
    return [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(count)]


def _hints(held: int) -> FaultHints:
    nodes = frozenset(f"gpu-node-{i:05d}.cluster.example" for i in range(held))
    return FaultHints(
        gpu_temperature_above=87,
        memory_temperature_above=95,
        held_nodes=nodes,
        xid_windows=(900, 3600, 86400),
    )


@pytest.mark.parametrize("held", [0, 3, GPUS // 8])
@pytest.mark.parametrize("candidates", [0, 1, 2, 8, 20, 500, GPUS])
def test_every_query_fits_the_limit_at_8000_gpus(held: int, candidates: int) -> None:
    hints = _hints(held)
    listed = [(u, "") for u in _uuids(GPUS)[:candidates]]
    texts = {
        "identity": identity_query(MATCHERS).text,
        "identity timestamps": identity_query(MATCHERS, timestamps=True).text,
        "inventory": exporter_inventory.query(MATCHERS).text,
        "idle candidates": idle_candidates_query(3600, 0.05, MATCHERS).text,
    }
    counted = xid_counts.query(hints.xid_windows, MATCHERS)
    assert counted is not None
    texts["xid counts"] = counted.text
    for query in cycle_queries(WINDOWS, MATCHERS, hints):
        texts[f"window {query.window}"] = query.text
    found = candidates_query(WINDOWS, hints, MATCHERS)
    assert found is not None
    texts["candidates"] = found.text
    assert FILTERED_WINDOWS  # the loop below checks every filtered window: there must be some
    for window in FILTERED_WINDOWS:
        parts = restricted_queries(window, WINDOWS[window], hints, listed, MATCHERS)
        assert 1 <= len(parts) <= MAX_WINDOW_PARTS
        for part in parts:
            assert part.window is window
        planned = {f'"{s.name}:{a}"' for s, aggs in QUERY_PLAN[window].items() for a in aggs}
        assert {tag for tag in planned if any(tag in p.text for p in parts)} == planned  # nothing dropped
        for i, part in enumerate(parts):
            texts[f"{window} part {i}"] = part.text
            if len(listed) <= 8:  # a few candidates are listed, not fetched over every GPU
                assert all(u in part.text for u, _ in listed)
                assert part.keys == frozenset(listed)
    over = {name: len(text) for name, text in texts.items() if len(text.encode()) > MAX_QUERY_BYTES}
    assert over == {}


def test_a_filtered_window_split_in_parts_merges_per_signal() -> None:
    key = ("GPU-a", "")
    first = TrustedRows({key: {"10.0.0.1:9400": {"XID": [1.0]}}})  # type: ignore[dict-item]
    second = TrustedRows({key: {"10.0.0.1:9400": {"ECC": [2.0]}, "10.0.0.2:9400": {"ECC": [3.0]}}})  # type: ignore[dict-item]
    merged = merge_window(merge_window(None, first), second)
    assert merged.values == {
        key: {"10.0.0.1:9400": {"XID": [1.0], "ECC": [2.0]}, "10.0.0.2:9400": {"ECC": [3.0]}}
    }
    plain = merge_window({key: {"A": [1.0]}}, {key: {"B": [2.0]}, ("GPU-b", ""): {"A": [0.0]}})
    assert plain == {key: {"A": [1.0], "B": [2.0]}, ("GPU-b", ""): {"A": [0.0]}}


def _source(handler: object, url: str = "http://vmselect:8481/select/0/prometheus/") -> PrometheusSource:
    return PrometheusSource(PrometheusConfig(url=url, retries=0), transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def _request() -> FetchRequest:
    return FetchRequest(windows={Window.ACTIVITY: 600.0}, now=1_700_000_000.0, scrape_interval=15.0)


def test_a_base_url_with_a_path_is_joined_and_vm_answers_are_read() -> None:
    seen: list[str] = []
    answer = {
        "status": "success",
        "isPartial": False,
        "data": {"resultType": "vector", "result": [{"metric": {"UUID": "GPU-a"}, "value": [1, "2"]}]},
        "stats": {"seriesFetched": "1", "executionTimeMsec": 0},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json=answer)

    source = _source(handler)
    assert source.query("up") == [({"UUID": "GPU-a"}, 2.0)]
    assert seen == ["/select/0/prometheus/api/v1/query"]
    result = [{"metric": {"UUID": f"GPU-{i}", "GPU_I_ID": ""}, "value": [1, str(i)]} for i in range(40)]
    body = json.dumps({**answer, "data": {"resultType": "vector", "result": result}}, separators=(",", ":"))
    pieces = [body.encode()[i : i + 7] for i in range(0, len(body), 7)]
    streamed = [item for chunk in iter_vector(pieces, chunk_bytes=64) for item in chunk]
    assert streamed == result  # streamed in pieces, its "stats" after the data ignored


def test_a_partial_answer_is_missing_data_not_an_answer() -> None:
    partial = {"status": "success", "isPartial": True, "data": {"resultType": "vector", "result": []}}
    body = json.dumps(partial, separators=(",", ":")).encode()
    with pytest.raises(SourceUnavailable, match="partial"):
        decode_vector(body)
    with pytest.raises(SourceUnavailable, match="partial"):
        list(iter_vector([body]))
    source = _source(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "application/json"})
    )
    with pytest.raises(SourceUnavailable, match="partial"):  # the cycle's MetricsAvailable=False, no verdict
        source.fetch(_request())


REFUSAL = "too long query; got 17292 bytes; mustn't exceed `-search.maxQueryLen=16384` bytes"
#: VictoriaMetrics' own refusal (``httpserver.SendPrometheusError``), and a gateway's in plain text.
REFUSALS: list[Callable[[httpx.Request], httpx.Response]] = [
    lambda _: httpx.Response(400, json={"status": "error", "errorType": "400", "error": REFUSAL}),
    lambda _: httpx.Response(400, text=REFUSAL, headers={"content-type": "text/plain; charset=utf-8"}),
    lambda _: httpx.Response(422, text=REFUSAL, headers={"content-type": "text/plain; charset=utf-8"}),
]
KINDS = ["json-400", "text-400", "text-422"]


@pytest.mark.parametrize("answer", REFUSALS, ids=KINDS)
def test_a_refused_query_names_the_backends_answer(answer: Callable[[httpx.Request], httpx.Response]) -> None:
    with pytest.raises(SourceUnavailable, match=r"maxQueryLen=16384"):
        _source(answer).fetch(_request())


@pytest.mark.parametrize("answer", REFUSALS, ids=KINDS)
def test_a_refused_query_reaches_the_metrics_condition_and_event(
    answer: Callable[[httpx.Request], httpx.Response],
) -> None:
    """Through the cycle: MetricsAvailable=False and its Warning event carry the backend's words."""
    refusal = REFUSAL
    source = _source(answer)
    runner: Any = CycleRunner(
        config=OperatorConfig(),
        reader=_Reader(),
        applier=None,  # type: ignore[arg-type]
        status_writer=None,  # type: ignore[arg-type]
        source_for=OneSource(source),
        leader=None,  # type: ignore[arg-type]
        clock=lambda: 1_700_000_000.0,
    )
    snapshot, _, result = runner.observe("p", 1, GPUEfficiencyPolicySpec(), GPUEfficiencyPolicyStatus())
    assert result is None
    assert not snapshot.metrics_available
    plan = plan_cycle(snapshot)
    (condition,) = [c for c in plan.status.conditions if c.type == names.COND_METRICS]
    assert condition.status == "False"
    assert refusal in condition.message
    events = [
        a for a in plan.actions if isinstance(a, PolicyEvent) and a.reason == names.EV_METRICS_UNAVAILABLE
    ]
    assert len(events) == 1
    assert refusal in events[0].message
    assert plan.verdicts == ()  # nothing judged, nothing evicted or tainted
