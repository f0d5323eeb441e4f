"""Tiered activity refresh through real HTTP: which queries go out, what comes back, cycle to cycle.

The fake Prometheus below holds a small GPU model and answers the identity (with newest-sample
times), idle-candidates, fault-candidates and activity queries from it, honouring ``UUID=~`` lists
and chain-only queries, so the source's cache can be driven through cycles.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest
from tests.unit.sources.fake_http import QuietHandler, serving

from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources import prometheus as prom
from gpu_efficiency.sources.base import ActivityHints, FaultHints, FetchRequest, FetchResult
from gpu_efficiency.sources.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.promql import AGG_LABEL, CANDIDATE_LABEL, QUERY_PLAN, idle_limit

NOW = 1_700_000_000.0
WINDOWS = {Window.ACTIVITY: 120.0, Window.FAULT: 120.0, Window.THERMAL_HOLD: 120.0}
HINTS = FaultHints(gpu_temperature_above=90)


@dataclass
class GPU:
    node: str = "n1"
    pod: str = ""
    newest: float | None = NOW - 3  # None: no time in the identity answer (NaN)
    sm: float = 0.5  # SM_ACTIVE max/avg; FB_USED follows it
    ts: float = NOW - 3
    fb: float = 1000.0


@dataclass
class Model:
    gpus: dict[str, GPU] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    hold_identity: bool = False  # answer identity only once an activity query came (or after 5 s)
    activity_asked: threading.Event = field(default_factory=threading.Event)
    activity_before_identity: bool = False

    def answer(self, query: str) -> list[tuple[dict[str, str], Any]]:
        if query.startswith("group by (UUID, GPU_I_ID, gpu") or query.startswith(
            "max by (UUID, GPU_I_ID, gpu"
        ):
            timed = query.startswith("max")
            return [
                (
                    {"UUID": u, "gpu": "0", "Hostname": g.node, "pod": g.pod, "namespace": "ns"},
                    ("NaN" if g.newest is None else g.newest) if timed else 1,
                )
                for u, g in self.gpus.items()
            ]
        if CANDIDATE_LABEL in query:
            return []
        if AGG_LABEL not in query and "DCGM_FI_PROF_SM_ACTIVE" in query:  # idle candidates
            limit = float(re.findall(r"< ([0-9.e-]+)", query)[0])  # the first term: SM_ACTIVE
            assert limit == idle_limit(0.01, 1.0)
            return [({"UUID": u}, g.sm) for u, g in self.gpus.items() if g.sm < limit]
        if AGG_LABEL in query:
            listed = re.search(r'UUID=~"([^"]*)"', query)
            uuids = listed.group(1).split("|") if listed else list(self.gpus)
            out: list[tuple[dict[str, str], Any]] = []
            for uuid in uuids:
                gpu = self.gpus.get(uuid)
                if gpu is None:
                    continue
                values = {Signal.SM_ACTIVE: gpu.sm, Signal.FB_USED: gpu.fb}
                for signal, value in values.items():
                    for agg in QUERY_PLAN[Window.ACTIVITY][signal]:
                        tag = f"{signal.name}:{agg}"
                        if f'"{tag}"' in query:
                            v = {"count": 8, "ts": gpu.ts}.get(agg, value)
                            out.append(({"UUID": uuid, AGG_LABEL: tag}, v))
            return out
        return []


class _Handler(QuietHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        model: Model = self.server.model  # type: ignore[attr-defined]
        model.queries.append(query)
        if query.startswith("max by (UUID, GPU_I_ID, gpu"):  # identity (its terms are tagged too)
            if model.hold_identity:
                model.activity_before_identity = model.activity_asked.wait(5)
        elif AGG_LABEL in query:
            model.activity_asked.set()
        result = [{"metric": m, "value": [NOW, str(v)]} for m, v in model.answer(query)]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.reply_json(body)


@pytest.fixture
def model() -> Iterator[Model]:
    with serving(_Handler, model=Model()) as server:
        server.model.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
        yield server.model  # type: ignore[attr-defined]


def _source(model: Model, budget: int) -> PrometheusSource:
    return PrometheusSource(PrometheusConfig(url=model.url), refresh_budget=budget)  # type: ignore[attr-defined]


def _fetch(source: PrometheusSource, model: Model, now: float = NOW) -> tuple[FetchResult, list[str]]:
    model.queries.clear()
    request = FetchRequest(
        now=now, windows=WINDOWS, scrape_interval=15.0, hints=HINTS, activity=ActivityHints(idle_below=0.01)
    )
    result = source.fetch(request)
    return result, list(model.queries)


def _activity(sent: list[str]) -> list[str]:
    return [q for q in sent if AGG_LABEL in q and "SM_ACTIVE:max" in q]


def _listed(query: str) -> set[str]:
    found = re.search(r'UUID=~"([^"]*)"', query)
    return set(found.group(1).split("|")) if found else {"*"}


def _sm(result: FetchResult, uuid: str) -> Any:
    return {g.uuid: g for g in result.gpus}[uuid].get(Window.ACTIVITY, Signal.SM_ACTIVE)


def _busy_cluster(model: Model, n: int) -> None:
    model.gpus = {f"GPU-{i}": GPU(pod=f"p{i}") for i in range(n)}


def test_budget_zero_sends_todays_queries_and_results(model: Model) -> None:
    _busy_cluster(model, 4)
    model.gpus["GPU-0"].sm = 0.0
    tiered_off, sent = _fetch(_source(model, 0), model)
    plain = PrometheusSource(PrometheusConfig(url=model.url))  # type: ignore[attr-defined]
    model.queries.clear()
    today = plain.fetch(FetchRequest(now=NOW, windows=WINDOWS, scrape_interval=15.0, hints=HINTS))
    assert sorted(sent) == sorted(model.queries)
    assert tiered_off.gpus == today.gpus
    assert (tiered_off.refreshed, tiered_off.carried) == (None, 0)
    again, sent_again = _fetch(_source(model, 0), model)
    assert sorted(sent_again) == sorted(sent)  # no cache: the same every cycle
    assert again.gpus == today.gpus


def test_first_cycle_fetches_everything_then_carries_busy_gpus(model: Model) -> None:
    _busy_cluster(model, 6)
    source = _source(model, 1)
    first, sent = _fetch(source, model)
    assert _listed(_activity(sent)[0]) == {"*"}  # the cache is empty: the unrestricted query
    assert (first.refreshed, first.carried) == (6, 0)
    assert len(sent) == 4  # identity, idle candidates, fault candidates, activity
    second, sent = _fetch(source, model, NOW + 200)
    assert (second.refreshed, second.carried) == (1, 5)
    assert [_listed(q) for q in _activity(sent)] == [{"GPU-0"}]  # the least recently refreshed
    third, sent = _fetch(source, model, NOW + 230)
    assert [_listed(q) for q in _activity(sent)] == [{"GPU-1"}]
    assert third.gpus[0].stats[Window.ACTIVITY].keys() == first.gpus[0].stats[Window.ACTIVITY].keys()


def test_carried_stats_take_the_identity_timestamp(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    for gpu in model.gpus.values():
        gpu.newest = NOW + 27
    result, _ = _fetch(source, model, NOW + 200)
    carried = _sm(result, "GPU-2")
    assert carried.last_timestamp == NOW + 27
    assert carried.max == 0.5
    fb = {g.uuid: g for g in result.gpus}["GPU-2"].get(Window.ACTIVITY, Signal.FB_USED)
    assert fb.last_timestamp == NOW + 27


def test_absent_identity_timestamp_is_not_carried(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].newest = None
    result, sent = _fetch(source, model, NOW + 200)
    assert "GPU-2" in set().union(*(_listed(q) for q in _activity(sent)))
    assert _sm(result, "GPU-2").last_timestamp == NOW - 3  # its own, fetched


def test_identity_change_refreshes_in_full(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].pod = "new-pod"
    model.gpus["GPU-2"].fb = 5.0
    result, sent = _fetch(source, model, NOW + 200)
    full = [q for q in _activity(sent) if "FB_USED" in q]
    assert set().union(*(_listed(q) for q in full)) == {"GPU-0", "GPU-2"}  # new pod + the budget's one
    fb = {g.uuid: g for g in result.gpus}["GPU-2"].get(Window.ACTIVITY, Signal.FB_USED)
    assert fb.max == 5.0


def test_gpu_turning_idle_is_refreshed_and_seen_idle(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].sm = 0.0
    result, sent = _fetch(source, model, NOW + 200)
    chain = [q for q in _activity(sent) if "FB_USED" not in q]
    assert [_listed(q) for q in chain] == [{"GPU-2"}]  # only its activity chain
    assert _sm(result, "GPU-2").max == 0.0


def test_idle_gpu_turning_active_is_refreshed(model: Model) -> None:
    """Safety: a GPU cached idle is refreshed every cycle, so it is seen active the cycle it is."""
    _busy_cluster(model, 8)
    model.gpus["GPU-2"].sm = 0.0
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].sm = 0.9  # the idle filter no longer names it: only rule 3 brings it
    result, sent = _fetch(source, model, NOW + 200)
    assert "GPU-2" in set().union(*(_listed(q) for q in _activity(sent)))
    assert _sm(result, "GPU-2").max == 0.9


def test_large_refresh_sets_are_chunked_and_most_gpus_go_unrestricted(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prom, "MAX_LISTED_GPUS", 2)
    _busy_cluster(model, 12)
    source = _source(model, 5)
    _fetch(source, model)
    result, sent = _fetch(source, model, NOW + 200)
    listed = [_listed(q) for q in _activity(sent)]
    assert sorted(len(x) for x in listed) == [1, 2, 2]  # 5 GPUs, 2 a query
    assert set().union(*listed) == set(sorted(model.gpus)[:5])  # key order: GPU-0, GPU-1, GPU-10, ...
    assert result.queries == 3 + 3
    for gpu in model.gpus.values():
        gpu.sm = 0.0  # all idle: the refresh set is every GPU
    result, sent = _fetch(source, model, NOW + 230)
    listed = [_listed(q) for q in _activity(sent)]
    # the budget's chunks (sent before the plan was known; they run concurrently, so they may
    # reach the server after it) and one unrestricted query
    assert listed.count({"*"}) == 1
    assert sorted(len(x) for x in listed if x != {"*"}) == [1, 2, 2]
    assert (result.refreshed, result.carried) == (12, 0)


def test_budget_chunk_goes_out_before_identity_answers(model: Model) -> None:
    """Rule 4 needs nothing from this cycle's answers: its chunk must not wait for identity."""
    _busy_cluster(model, 6)
    source = _source(model, 2)
    _fetch(source, model)
    model.hold_identity = True
    model.activity_asked.clear()
    result, sent = _fetch(source, model, NOW + 200)
    assert model.activity_before_identity
    assert [_listed(q) for q in _activity(sent)] == [{"GPU-0", "GPU-1"}]
    assert (result.refreshed, result.carried) == (2, 4)


def test_one_shot_commands_get_an_empty_cache(model: Model) -> None:
    """report/explain build a new source with budget 0; a new source with a budget starts empty."""
    _busy_cluster(model, 2)
    result, sent = _fetch(_source(model, 1), model)
    assert result.carried == 0
    assert _listed(_activity(sent)[0]) == {"*"}
    assert math.isfinite(_sm(result, "GPU-0").max)
