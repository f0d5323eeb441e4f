"""Malformed metric answers read as "metrics unavailable", never as a crash (issue 19, finding 8).

Both decoders get arbitrary JSON, and JSON shaped almost like a real answer (so the fuzzing reaches
past the first check): the only exception allowed out is SourceUnavailable, and what comes back is
well typed. Before the fix, wrong shapes escaped as AttributeError/TypeError and a zero
``interval_seconds`` as ZeroDivisionError (11 distinct escapes in these two properties).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_efficiency.engine.model import GPUSample, Window
from gpu_efficiency.sources.metrics.agent import (
    SNAPSHOT_SCHEMA,
    AgentEndpoint,
    AgentSource,
    samples_from_snapshot,
)
from gpu_efficiency.sources.metrics.base import DropTally, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus.answers import candidates, identities
from gpu_efficiency.sources.metrics.prometheus.vector import decode_vector, iter_vector
from gpu_efficiency.sources.metrics.prometheus.windows import fold_window, samples

KEYS = ["UUID", "GPU_I_ID", "__agg__", "gpu", "Hostname", "pod", "namespace", "metric", "value", "result"]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["NaN", "0", "1", "+Inf", "SM_ACTIVE:avg", "GPU-1"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=20,
)
LABELS = st.dictionaries(
    st.sampled_from(["UUID", "GPU_I_ID", "__agg__", "gpu", "Hostname", "pod", "namespace", "modelName"]),
    JSON | st.sampled_from(["GPU-1", "SM_ACTIVE:avg", "0"]),
    max_size=6,
)
SERIES = st.fixed_dictionaries({"metric": LABELS | JSON, "value": st.tuples(JSON, JSON) | JSON})
VECTORS = st.builds(
    lambda result, kind: {"status": "success", "data": {"resultType": kind, "result": result}},
    st.lists(SERIES | JSON, max_size=4) | JSON,
    st.just("vector") | JSON,
)
ANSWERS = VECTORS | st.builds(lambda data: {"status": "success", "data": data}, JSON) | JSON
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
REQUEST = FetchRequest(now=1000.0, windows={Window.ACTIVITY: 60.0}, scrape_interval=15.0)


#: The series boundary iter_vector cuts at, nested inside a series (found by this property).
NESTED_BOUNDARY = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [{"metric": {}, "value": [{}, {"metric": 1}]}, {"metric": {}}],
    },
}


@FUZZ
@given(ANSWERS)
@example(NESTED_BOUNDARY)
def test_prometheus_answers_decode_or_are_unavailable(answer: Any) -> None:
    body = orjson.dumps(answer)
    try:
        series = decode_vector(body)
    except SourceUnavailable:
        series = []
    for labels, value in series:
        assert all(type(k) is str and type(v) is str for k, v in labels.items())
        assert isinstance(value, float)
    identity = identities(series)
    candidates(series, DropTally())
    try:
        rows = fold_window(iter_vector([body[i : i + 7] for i in range(0, len(body), 7)], 16))
    except SourceUnavailable:
        rows = {}
    assert all(type(u) is str and type(i) is str for u, i in rows)
    gpus = samples(identity, {Window.ACTIVITY: rows}, REQUEST)
    assert all(isinstance(g, GPUSample) and type(g.uuid) is str for g in gpus)


STAT = st.fixed_dictionaries(
    {k: JSON | st.just(1) for k in ("avg", "max", "min", "last", "count", "last_timestamp")}
)
GPU = st.fixed_dictionaries(
    {"uuid": JSON | st.just("GPU-1"), "index": JSON},
    optional={
        "stats": st.dictionaries(
            st.sampled_from(["activity", "fault"]) | st.text(max_size=3),
            st.dictionaries(st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "x"]), STAT | JSON) | JSON,
        ),
        "mig": JSON,
        "pods": st.lists(st.dictionaries(st.sampled_from(["namespace", "name", "uid", "container"]), JSON))
        | JSON,
        "fields": st.dictionaries(st.just("fb_total_mib"), JSON) | JSON,
        "model": JSON,
    },
)
SNAPSHOTS = (
    st.fixed_dictionaries(
        {
            "schema": st.just(SNAPSHOT_SCHEMA),
            "node": JSON | st.just("n"),
            "interval_seconds": JSON | st.sampled_from([0, -1, 0.0, "0"]),
            "timestamp": JSON,
            "gpus": st.lists(GPU, max_size=3) | JSON,
        }
    )
    | JSON
)


@FUZZ
@given(SNAPSHOTS)
def test_agent_snapshots_decode_or_are_unavailable(snapshot: Any) -> None:
    try:
        gpus = samples_from_snapshot(snapshot, {Window.ACTIVITY: 60.0}, uid_resolver=lambda uid: None)
    except SourceUnavailable:
        return
    for gpu in gpus:
        assert type(gpu.node) is str
        assert type(gpu.uuid) is str
        assert all(type(p.namespace) is str and type(p.name) is str for p in gpu.pods)


def _snapshot(node: str, interval: Any) -> dict[str, Any]:
    stat = {"avg": 0.5, "max": 0.5, "min": 0.5, "last": 0.5, "count": 30, "last_timestamp": 100.0}
    return {
        "schema": SNAPSHOT_SCHEMA,
        "node": node,
        "timestamp": 100.0,
        "interval_seconds": interval,
        "ready": True,
        "gpus": [{"index": 0, "uuid": f"GPU-{node}", "stats": {"activity": {"DCGM_FI_DEV_GPU_UTIL": stat}}}],
    }


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (_snapshot("b", 0), "interval_seconds 0.0 is not a positive number"),
        ([1, 2], "answered list"),
        ({**_snapshot("b", 2.0), "gpus": [["not", "a", "gpu"]]}, "malformed agent snapshot"),
        ({**_snapshot("b", 2.0), "gpus": {"uuid": "x"}}, "malformed agent snapshot"),
    ],
)
def test_one_malformed_agent_leaves_the_other_nodes_their_samples(bad: Any, why: str) -> None:
    answers = {"a": _snapshot("a", 2.0), "b": bad}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=orjson.dumps(answers[request.url.host]))

    endpoints = [AgentEndpoint("http://a", "a"), AgentEndpoint("http://b")]
    source = AgentSource(lambda: endpoints, transport=httpx.MockTransport(answer))
    result = source.fetch(FetchRequest(now=100.0, windows={Window.ACTIVITY: 60.0}, scrape_interval=0.0))
    source.close()
    assert [g.uuid for g in result.gpus] == ["GPU-a"]
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("agent http://b: ")
    assert why in result.warnings[0]
