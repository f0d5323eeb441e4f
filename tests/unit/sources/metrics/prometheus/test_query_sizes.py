"""Every query the Prometheus source sends fits VictoriaMetrics' default ``-search.maxQueryLen``
(``MAX_QUERY_BYTES``) at 8,000 GPUs, whatever the fault candidates and held nodes; a refused query
and a partial answer are SourceUnavailable naming why (issue 35)."""

from __future__ import annotations

import json
import math
import random
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
from tests.unit.runtime.cycle_harness import OneSource
from tests.unit.runtime.test_source_failure import _Reader
from tests.unit.sources.metrics.fake_http import form

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import DEFAULT_MATCHERS, OperatorConfig
from gpu_efficiency.engine.model import PodRef, PolicyEvent, Signal, Window
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
    AGG_LABEL,
    FILTERED_WINDOWS,
    MAX_QUERY_BYTES,
    MAX_WINDOW_PARTS,
    QUERY_PLAN,
    Query,
    candidates_query,
    cycle_queries,
    identity_query,
    idle_candidates_query,
    restricted_queries,
    window_query,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.activity_cache import (
    CHAIN_SIGNALS,
    RefreshPlan,
    Seen,
    everything,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.fetch import MAX_ACTIVITY_QUERIES, activity_queries
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


# The tiered activity refresh (``--prometheus-refresh-budget`` > 0): its listed queries too.

ACTIVITY_TAGS = {f'"{s.name}:{a}"' for s, aggs in QUERY_PLAN[Window.ACTIVITY].items() for a in aggs}
CHAIN_TAGS = {
    f'"{s.name}:{a}"' for s, aggs in QUERY_PLAN[Window.ACTIVITY].items() if s in CHAIN_SIGNALS for a in aggs
}


def _selected(text: str, every: Sequence[str]) -> set[str]:
    """The UUIDs of ``every`` a query's selectors select (one UUID pattern in all of them, or none)."""
    patterns = set(re.findall(r'UUID(=~|!~)"((?:[^"\\]|\\.)*)"', text))
    assert len(patterns) <= 1, "selectors of one query select different GPUs"
    if not patterns:
        return set(every)
    ((op, pattern),) = patterns
    regex = re.compile(pattern.replace("\\\\", "\\"))
    return {u for u in every if bool(regex.fullmatch(u)) is (op == "=~")}


def _coverage(queries: Sequence[Query], every: Sequence[str]) -> dict[str, set[str]]:
    """Per UUID, the activity aggregates some query fetches for it (``Query.keys`` honoured)."""
    got: dict[str, set[str]] = {}
    for query in queries:
        # a raw-sample query reads the chain's (or the whole window's) samples: every aggregate of
        # them is made from them
        raw = ACTIVITY_TAGS if query.whole else CHAIN_TAGS
        tags = set(raw) if query.samples else {tag for tag in ACTIVITY_TAGS if tag in query.text}
        for gpu in _selected(query.text, every):
            if query.keys is None or (gpu, "") in query.keys:
                got.setdefault(gpu, set()).update(tags)
    return got


def _seen(uuids: Sequence[str]) -> dict[tuple[str, str], Seen]:
    return {
        (u, ""): Seen(f"node-{i // 8}", frozenset({PodRef("ns", f"p{i}")}), 1.0) for i, u in enumerate(uuids)
    }


SHAPES = ["new", "idle", "new and idle", "idle, half asked early"]


@pytest.mark.parametrize("raw", [True, False], ids=["raw chain", "aggregated chain"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("count", [1, 2, 8, 20, 75, 350, 500, 2500, 4000, GPUS])
def test_the_tiered_refresh_queries_fit_the_limit_at_8000_gpus(shape: str, count: int, raw: bool) -> None:
    """Rules 1-3's activity queries (whole windows of new GPUs, chains of idle ones) fit
    ``MAX_QUERY_BYTES`` whatever the refresh set, and still fetch every aggregate the plan needs
    for every GPU it refreshes."""
    uuids = _uuids(GPUS)
    seen = _seen(uuids)
    keys = [(u, "") for u in uuids]
    picked = keys[:count]
    full = frozenset(picked if shape == "new" else picked[: count // 2] if shape == "new and idle" else [])
    chain = frozenset(picked) - full
    plan = RefreshPlan(full=full, chain=chain, carried=frozenset(keys) - full - chain)
    early = frozenset(u for u, _ in sorted(chain)[: len(chain) // 2]) if "early" in shape else frozenset()
    planned, queries = activity_queries(plan, seen, 3600, MATCHERS, early, raw)
    sizes = [len(q.text.encode()) for q in queries]
    assert queries
    assert max(sizes) <= MAX_QUERY_BYTES, sizes
    assert len(queries) <= MAX_ACTIVITY_QUERIES + 1
    got = _coverage(queries, uuids)
    for gpu, _ in planned.full:
        assert got.get(gpu) == ACTIVITY_TAGS, gpu
    for gpu, _ in planned.chain:
        assert gpu in early or got.get(gpu, set()) >= CHAIN_TAGS, gpu
    assert planned.refresh >= plan.refresh  # nothing the plan needs dropped: at most widened


@pytest.mark.parametrize("budget", [0, 1, 500, GPUS])
def test_the_refresh_budgets_queries_fit_the_limit_and_bring_every_gpu_round(budget: int) -> None:
    """Rule 4's background whole windows fit ``MAX_QUERY_BYTES`` at any budget, and every cached
    GPU is refreshed within about ``cached / budget`` cycles."""
    uuids = _uuids(GPUS)
    seen = _seen(uuids)
    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test", matchers=MATCHERS), refresh_budget=budget
    )
    sent: list[Query] = []

    def run(query: Query, at: float, *rest: object) -> dict[object, object]:
        sent.append(query)
        return {}

    source.run = run  # type: ignore[method-assign]
    cache = source.tiered._cache(3600)
    cache.update(seen, everything(seen), {}, 0.0)
    for entry in cache.entries.values():  # settled (rule 3b refreshes the others in full itself)
        entry.unsettled_at = -math.inf
    rounds = 0 if budget == 0 else min(20, math.ceil(GPUS / budget) + 2)  # budget 1: 20 of 8,000
    refreshed: set[str] = set()
    for cycle in range(1, rounds + 1):
        sent.clear()
        at = 10_000.0 * cycle
        started = source.tiered.refresh_oldest(cache, at, 300.0, 3600)
        assert source.tiered.wait_refreshes(10)
        sizes = [len(q.text.encode()) for q in sent]
        assert sent
        assert max(sizes) <= MAX_QUERY_BYTES, sizes
        assert len(sent) <= 4  # a few bytes per bucket: the query count does not grow with the budget
        now = {u for (u, _), entry in cache.entries.items() if entry.refreshed_at == at}
        assert started == len(now) >= 1
        assert all(tags == ACTIVITY_TAGS for u, tags in _coverage(sent, uuids).items() if u in now)
        assert now <= set(_coverage(sent, uuids))
        refreshed |= now
    if budget == 0:
        assert source.tiered.refresh_oldest(cache, 10_000.0, 300.0, 3600) == 0
        assert sent == []
    elif budget == 1:
        assert len(refreshed) == rounds  # one GPU a cycle (its UUID's ending is its own)
    else:
        assert refreshed == set(uuids)


# Matchers longer than the defaults: every term of a window repeats them.

LONG_MATCHERS = [
    DEFAULT_MATCHERS + ',namespace="gpu-operator"',  # as docs/install.md suggests with honorLabels false
    DEFAULT_MATCHERS + "," + ",".join(f'label{i}="{"x" * 40}"' for i in range(20)),  # ~1 KB
]


@pytest.mark.parametrize("matchers", LONG_MATCHERS, ids=["default and namespace", "1 KB"])
def test_unfiltered_windows_are_cut_to_fit_long_matchers_and_keep_every_aggregate(matchers: str) -> None:
    """The default path's whole windows (no hints: the fault windows too) and the tiered fetch's
    fallback to the whole activity window: cut into parts of whole signals under the limit, each
    part over every GPU, the fault windows' parts still per scrape target."""
    assert (
        len(window_query(Window.ACTIVITY, WINDOWS[Window.ACTIVITY], matchers).text.encode()) > MAX_QUERY_BYTES
    )
    sent = cycle_queries(WINDOWS, matchers)[1:]
    every = _uuids(GPUS)
    plan = RefreshPlan(full=frozenset(_seen(every)), chain=frozenset(), carried=frozenset())
    _, tiered = activity_queries(plan, _seen(every), WINDOWS[Window.ACTIVITY], matchers, raw=False)
    for queries in (sent, tiered):
        assert all(len(q.text.encode()) <= MAX_QUERY_BYTES for q in queries)
        assert all("UUID=~" not in q.text and q.keys is None for q in queries)
    # as raw samples (a series holds few enough in the window): one query per UUID ending, each GPU
    # in one of them with every aggregate, whatever the matchers
    _, raw = activity_queries(plan, _seen(every), WINDOWS[Window.ACTIVITY], matchers, raw=True)
    assert all(q.samples and q.whole and len(q.text.encode()) <= MAX_QUERY_BYTES for q in raw)
    assert all(matchers in q.text for q in raw)
    assert sum(len(_selected(q.text, every)) for q in raw) == len(every)
    assert _coverage(raw, every) == dict.fromkeys(every, ACTIVITY_TAGS)
    assert len([q for q in sent if q.window is Window.ACTIVITY]) >= 2
    for window in WINDOWS:
        parts = [q.text for q in sent if q.window is window]
        tags = [set(re.findall(r'"([A-Z_0-9]+:[a-z]+)"', text)) for text in parts]
        planned = {f"{s.name}:{a}" for s, aggs in QUERY_PLAN[window].items() for a in aggs}
        assert set().union(*tags) == planned
        signals = [{tag.split(":")[0] for tag in part} for part in tags]
        assert all(not (a & b) for i, a in enumerate(signals) for b in signals[i + 1 :])  # whole signals
        per_target = window in FILTERED_WINDOWS
        assert all(("by (UUID, GPU_I_ID, instance)" in text) == per_target for text in parts)


def test_a_window_no_cut_can_fit_is_sent_whole_for_the_backend_to_answer() -> None:
    matchers = ",".join(f'label{i}="{"x" * 200}"' for i in range(40))  # 9 KB: one term is too long
    queries = [q for q in cycle_queries(WINDOWS, matchers)[1:] if q.window is Window.ACTIVITY]
    assert [q.text for q in queries] == [
        window_query(Window.ACTIVITY, WINDOWS[Window.ACTIVITY], matchers).text
    ]


def test_the_source_reads_every_signal_through_the_parts_a_limited_backend_accepts() -> None:
    """Against a backend refusing queries over 16 KiB, as VictoriaMetrics does by default, with the
    default matchers and a namespace: every activity aggregate of the GPU arrives."""
    matchers = LONG_MATCHERS[0]
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = form(request)["query"][0]
        sent.append(len(query.encode()))
        if len(query.encode()) > MAX_QUERY_BYTES:
            return httpx.Response(400, json={"status": "error", "errorType": "400", "error": REFUSAL})
        if query.startswith("group by (UUID, GPU_I_ID, gpu"):
            result = [{"metric": {"UUID": "GPU-a", "Hostname": "n1"}, "value": [1, "1"]}]
        else:
            tags = re.findall(r'"([A-Z_0-9]+:[a-z]+)"', query)
            values = {"count": "8", "ts": "1699999990"}
            result = [
                {"metric": {"UUID": "GPU-a", AGG_LABEL: t}, "value": [1, values.get(t.split(":")[1], "0.5")]}
                for t in tags
            ]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    source = PrometheusSource(
        PrometheusConfig(url="http://vm:8428", matchers=matchers, retries=0),
        transport=httpx.MockTransport(handler),
    )
    result = source.fetch(_request())
    assert max(sent) <= MAX_QUERY_BYTES
    (gpu,) = result.gpus
    assert set(gpu.stats[Window.ACTIVITY]) == set(QUERY_PLAN[Window.ACTIVITY])
    sm = gpu.get(Window.ACTIVITY, Signal.SM_ACTIVE)
    assert sm is not None
    assert (sm.max, sm.count) == (0.5, 8)
