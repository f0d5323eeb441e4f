"""Tiered activity refresh through the HTTP client: which queries go out, what comes back, cycle to cycle.

The fake Prometheus below (an ``httpx.MockTransport`` handler, called on the querying thread as a
threaded server would be) holds a small GPU model and answers the identity (with newest-sample
times), idle-candidates, fault-candidates and activity queries from it, honouring ``UUID=~`` lists
and chain-only queries (a plain range selector of the chain's names: raw samples, a matrix), so the
source's cache can be driven through cycles.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
from tests.unit.sources.metrics.fake_http import form, json_answer, range_selector

from gpu_efficiency.engine.model import GPUSample, Signal, Window
from gpu_efficiency.engine.reclaim.activity import DataBounds, carried_bounds, gpu_activity
from gpu_efficiency.sources.metrics.base import (
    ActivityHints,
    FaultHints,
    FetchRequest,
    FetchResult,
    SourceUnavailable,
)
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource, promql, windows
from gpu_efficiency.sources.metrics.prometheus.promql import (
    AGG_LABEL,
    CANDIDATE_LABEL,
    MAX_QUERY_BYTES,
    QUERY_PLAN,
    Query,
    idle_limit,
)
from gpu_efficiency.sources.metrics.prometheus.tiered import chain_samples
from gpu_efficiency.sources.metrics.prometheus.tiered import fetch as prom

NOW = 1_700_000_000.0
URL = "http://prometheus.test"
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
    cycle: list[str] = field(default_factory=list)  # queries the source sent within its cycles
    background: list[str] = field(default_factory=list)  # and after them, refreshing (rule 4)
    started: int = 0  # GPUs the last cycle's deferred work (``FetchResult.then``) started refreshing
    release: threading.Event | None = None  # set: listed whole-window queries wait for it (5 s at most)
    fail_listed: bool = False  # listed whole-window queries get a PromQL error
    hold_identity: bool = False  # answer identity only once a chain-only query came (or after 5 s)
    chain_asked: threading.Event = field(default_factory=threading.Event)
    chain_before_identity: bool = False
    hold_identity_for_whole: bool = (
        False  # answer identity only once a whole-window bucket came (or after 5 s)
    )
    whole_asked: threading.Event = field(default_factory=threading.Event)
    whole_before_identity: bool = False
    fail_whole: bool = False  # whole-window buckets (raw samples) get a PromQL error
    hold_whole: threading.Event | None = None  # set: whole-window buckets wait for it (5 s at most)
    hold_chain: threading.Event | None = None  # set: chain-only queries wait for it (5 s at most)
    chain_released: list[bool] = field(default_factory=list)  # per held chain query: released in time
    times: list[str] = field(default_factory=list)  # each query's evaluation time, as sent
    per_series: int = 8  # samples per series in the window: the count answered, the raw samples sent
    faulty: dict[str, float] = field(default_factory=dict)  # UUID -> XID its fault window holds
    hold_candidates: threading.Event | None = None  # set: the fault candidates query waits for it

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
        if CANDIDATE_LABEL in query:  # fault candidates
            return [({"UUID": u, CANDIDATE_LABEL: Window.FAULT.value}, 1) for u in sorted(self.faulty)]
        if "gpueff_has" in query:  # the exporter inventory
            return []
        if '"XID:max"' in query:  # a fault window, of the candidates it lists
            return [
                ({"UUID": u, AGG_LABEL: f"XID:{agg}", "instance": "t1"}, value)
                for u in sorted(_matching(query, self.faulty))
                for agg, value in (("max", self.faulty[u]), ("last", self.faulty[u]), ("count", 8))
            ]
        if AGG_LABEL not in query and "DCGM_FI_PROF_SM_(ACTIVE|UTIL_RATIO)" in query:  # idle candidates
            limit = float(re.findall(r"< ([0-9.e-]+)", query)[0])  # the first term: SM_ACTIVE
            assert limit == idle_limit(0.01, 1.0)
            return [({"UUID": u}, g.sm) for u, g in self.gpus.items() if g.sm < limit]
        if AGG_LABEL in query:
            uuids = sorted(_matching(query, self.gpus))
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
                            v = {"count": self.per_series, "ts": gpu.ts}.get(agg, value)
                            out.append(({"UUID": uuid, AGG_LABEL: tag}, v))
            return out
        return []

    def samples(self, query: str) -> list[dict[str, Any]]:
        """A raw query's series: ``per_series`` samples of SM_ACTIVE (and of FB_USED where the query
        names it: the whole window), the newest at ``ts`` (the aggregates the aggregated answer
        gives: max and avg ``sm``, count ``per_series``, ts)."""
        names = {"DCGM_FI_PROF_SM_ACTIVE": "sm"} | (
            {"DCGM_FI_DEV_FB_USED": "fb"} if "FB_USED" in query else {}
        )
        return [
            {
                "metric": {"__name__": name, "UUID": uuid, "Hostname": gpu.node},
                "values": [
                    [gpu.ts - 15 * back, str(getattr(gpu, field))]
                    for back in range(self.per_series - 1, -1, -1)
                ],
            }
            for uuid in sorted(_matching(query, self.gpus))
            for gpu in [self.gpus[uuid]]
            for name, field in names.items()
        ]


def _handle(model: Model, request: httpx.Request) -> httpx.Response:
    fields = form(request)
    query = fields["query"][0]
    model.queries.append(query)
    model.times.append(fields.get("time", [""])[0])
    listed_whole = "FB_USED:max" in query and "UUID=~" in query
    if _raw(query) and "FB_USED" in query:
        model.whole_asked.set()
        if model.hold_whole is not None:
            model.hold_whole.wait(5)
    if CANDIDATE_LABEL in query and model.hold_candidates is not None:
        model.hold_candidates.wait(5)
    if query.startswith("max by (UUID, GPU_I_ID, gpu") and model.hold_identity_for_whole:
        model.whole_before_identity = model.whole_asked.wait(5)
    if query.startswith("max by (UUID, GPU_I_ID, gpu") and model.hold_identity:
        model.chain_before_identity = model.chain_asked.wait(5)
    elif _is_chain(query):
        model.chain_asked.set()
        if model.hold_chain is not None:
            model.chain_released.append(model.hold_chain.wait(5))
    if model.release is not None and listed_whole:
        model.release.wait(5)
    if (model.fail_listed and listed_whole) or (model.fail_whole and _raw(query) and "FB_USED" in query):
        error = {"status": "error", "errorType": "execution", "error": "query timed out"}
        return json_answer(json.dumps(error).encode(), status=422)
    if _raw(query):
        return json_answer(
            json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": model.samples(query)}}
            ).encode()
        )
    result = [{"metric": m, "value": [NOW, str(v)]} for m, v in model.answer(query)]
    return json_answer(
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    )


#: The test's model (``_listed`` resolves patterns against its GPUs).
MODELS: list[Model] = []


@pytest.fixture
def model() -> Model:
    MODELS[:] = [Model()]
    return MODELS[0]


def _plain(model: Model, refresh_budget: int = 0) -> PrometheusSource:
    """A source asking ``model``."""
    transport = httpx.MockTransport(lambda request: _handle(model, request))
    return PrometheusSource(PrometheusConfig(url=URL), refresh_budget=refresh_budget, transport=transport)


def _source(model: Model, budget: int) -> PrometheusSource:
    """A source whose queries are recorded as the cycle's or the background refresh's (by thread)."""
    source = _plain(model, refresh_budget=budget)
    run = source.run

    def recorded(query: Query, at: float, *rest: Any) -> Any:
        background = threading.current_thread().name == "prometheus-refresh"
        (model.background if background else model.cycle).append(query.text)
        return run(query, at, *rest)

    source.run = recorded  # type: ignore[method-assign]
    return source


def _fetch(
    source: PrometheusSource, model: Model, now: float = NOW, scrape_interval: float = 15.0
) -> tuple[FetchResult, list[str]]:
    """One cycle and the background refresh it starts; returns the cycle's queries (the refresh's
    are in ``model.background``)."""
    model.cycle.clear()
    model.background.clear()
    request = FetchRequest(
        now=now,
        windows=WINDOWS,
        scrape_interval=scrape_interval,
        hints=HINTS,
        activity=ActivityHints(idle_below=0.01),
    )
    result = source.fetch(request)
    sent = list(model.cycle)
    model.started = result.then() if result.then is not None else 0  # as the cycle does, after its writes
    assert source.wait_refreshes(10)
    return result, sent


def _raw(query: str) -> bool:
    """A raw-sample query: a plain range selector (``tiered/chain_samples.py``)."""
    return range_selector(query)


def _is_chain(query: str) -> bool:
    """A chain-only activity query: raw samples or the aggregated chain, without FB_USED (raw
    samples with it: a bucket of the whole window, ``chain_samples.whole_sample_queries``)."""
    return (_raw(query) or (AGG_LABEL in query and "SM_ACTIVE:max" in query)) and "FB_USED" not in query


def _activity(sent: list[str]) -> list[str]:
    return [q for q in sent if _raw(q) or (AGG_LABEL in q and "SM_ACTIVE:max" in q)]


def _matching(query: str, uuids: Iterable[str]) -> set[str]:
    """The UUIDs a query's ``UUID=~`` pattern selects (``UUID!~``: the others; every one without a pattern); the
    pattern is unescaped from its PromQL string and matched whole, as Prometheus does."""
    found = re.search(r'UUID(=~|!~)"((?:[^"\\]|\\.)*)"', query)
    if not found:
        return set(uuids)
    regex = re.compile(found.group(2).replace("\\\\", "\\"))
    return {u for u in uuids if bool(regex.fullmatch(u)) is (found.group(1) == "=~")}


def _listed(query: str) -> set[str]:
    """The model's GPUs a query selects ({"*"} without a pattern: every GPU)."""
    return _matching(query, MODELS[-1].gpus) if "UUID=~" in query or "UUID!~" in query else {"*"}


def _whole_buckets(sent: list[str]) -> set[str]:
    """The GPUs of a whole window read as raw samples by UUID ending, checking that it is one query
    per ``WHOLE_BUCKETS`` ending and one for the rest, each GPU in exactly one of them."""
    assert len(sent) == len(chain_samples.WHOLE_BUCKETS) + 1
    assert all(_raw(q) and "FB_USED" in q for q in sent)
    listed = [uuid for q in sent for uuid in _listed(q)]
    assert len(listed) == len(set(listed))
    return set(listed)


def _gpu(result: FetchResult, uuid: str) -> GPUSample:
    return {g.uuid: g for g in result.gpus}[uuid]


def _sm(result: FetchResult, uuid: str) -> Any:
    return _gpu(result, uuid).get(Window.ACTIVITY, Signal.SM_ACTIVE)


def _fb(result: FetchResult, uuid: str) -> Any:
    return _gpu(result, uuid).get(Window.ACTIVITY, Signal.FB_USED)


def _values(gpus: tuple[GPUSample, ...]) -> str:
    """The samples as text, signals in one order: NaN fields (not measured) compare equal."""
    ordered = [
        replace(g, stats={w: dict(sorted(v.items(), key=lambda kv: kv[0].value)) for w, v in g.stats.items()})
        for g in gpus
    ]
    return repr(ordered)


def _busy_cluster(model: Model, n: int) -> None:
    model.gpus = {f"GPU-{i}": GPU(pod=f"p{i}") for i in range(n)}


def _five_go_idle(model: Model) -> tuple[PrometheusSource, list[str]]:
    """Twelve busy GPUs fetched once (budget 1), then five of them idle: the source and those five."""
    _busy_cluster(model, 12)
    source = _source(model, 1)
    _fetch(source, model)
    idle = sorted(model.gpus)[:5]
    for uuid in idle:
        model.gpus[uuid].sm = 0.0
    return source, idle


def test_budget_zero_sends_todays_queries_and_results(model: Model) -> None:
    _busy_cluster(model, 4)
    model.gpus["GPU-0"].sm = 0.0
    tiered_off, sent = _fetch(_source(model, 0), model)
    plain = _plain(model)
    model.queries.clear()
    today = plain.fetch(FetchRequest(now=NOW, windows=WINDOWS, scrape_interval=15.0, hints=HINTS))
    assert sorted(sent) == sorted(model.queries)
    assert tiered_off.gpus == today.gpus
    assert (tiered_off.refreshed, tiered_off.carried) == (None, 0)
    assert tiered_off.then is not None
    assert tiered_off.then() == 0  # after the cycle: only an old exporter inventory, and this one is new
    again, sent_again = _fetch(_source(model, 0), model)
    assert sorted(sent_again) == sorted(sent)  # no cache: the same every cycle
    assert again.gpus == today.gpus
    assert model.background == []


def test_first_cycle_fetches_everything_then_carries_busy_gpus(model: Model) -> None:
    _busy_cluster(model, 6)
    source = _source(model, 1)
    first, sent = _fetch(source, model)
    whole = _activity(sent)  # the cache is empty: every GPU's whole window, as raw samples
    assert _whole_buckets(whole) == set(model.gpus)
    assert (first.refreshed, first.carried, model.started) == (6, 0, 0)  # all just refreshed
    assert len(sent) == 4 + len(whole)  # identity, idle candidates, fault candidates, inventory, activity
    assert model.background == []
    second, sent = _fetch(source, model, NOW + 200)
    assert (second.refreshed, second.carried, model.started) == (0, 6, 1)
    assert _activity(sent) == []  # every GPU busy and settled: no activity query in the cycle
    assert [_listed(q) for q in model.background] == [{"GPU-0"}]  # then the least recently refreshed
    third, sent = _fetch(source, model, NOW + 230)
    assert [_listed(q) for q in model.background] == [{"GPU-1"}]
    assert third.gpus[0].stats[Window.ACTIVITY].keys() == first.gpus[0].stats[Window.ACTIVITY].keys()


def test_whole_windows_are_carried_with_the_stats_made_when_they_were_fetched(model: Model) -> None:
    """A window fetched whole gives the same Stats as without the cache, not marked carried, and
    the cache keeps them: the next cycle carries those very objects instead of building them again
    (after the first cycle, every GPU at once)."""
    _busy_cluster(model, 4)
    model.gpus["GPU-3"].sm = 0.0  # idle: fetched again every cycle, never carried
    source = _source(model, 1)
    first, _ = _fetch(source, model)
    plain = _plain(model)
    today = plain.fetch(FetchRequest(now=NOW, windows=WINDOWS, scrape_interval=15.0, hints=HINTS))
    assert _values(first.gpus) == _values(today.gpus)
    assert all(g.carried_newest is None for g in first.gpus)
    second, _ = _fetch(source, model, NOW + 200)
    for uuid in ("GPU-0", "GPU-1", "GPU-2"):
        assert _gpu(second, uuid).carried_newest is not None
        assert _gpu(second, uuid).stats[Window.ACTIVITY] is _gpu(first, uuid).stats[Window.ACTIVITY]
    assert _gpu(second, "GPU-3").carried_newest is None
    assert _gpu(second, "GPU-3").stats[Window.ACTIVITY] is not _gpu(first, "GPU-3").stats[Window.ACTIVITY]


def test_rule_4_is_fetched_at_the_cycles_time_and_carried_by_the_next_cycles(model: Model) -> None:
    _busy_cluster(model, 3)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-0"].fb = 7.0  # a busy GPU's other figures change: rule 4 brings them in
    second, _ = _fetch(source, model, NOW + 200)
    assert _fb(second, "GPU-0").max == 1000.0  # this cycle carried the old figure
    assert model.times[-1] == f"{NOW + 200:.3f}"  # the refresh asked for the cycle's own time
    third, sent = _fetch(source, model, NOW + 230)
    assert "GPU-0" not in set().union(set(), *(_listed(q) for q in _activity(sent)))
    assert _fb(third, "GPU-0").max == 7.0  # carried from the refresh


def test_carried_windows_keep_their_stats_and_are_judged_by_the_identity_timestamp(model: Model) -> None:
    """A carried window is the cache entry's own Stats (fetched times), the same objects from cycle
    to cycle; its sample carries identity's newest time, which decides its freshness."""
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    for gpu in model.gpus.values():
        gpu.newest = NOW + 197
    second, _ = _fetch(source, model, NOW + 200)
    third, _ = _fetch(source, model, NOW + 230)
    carried = _gpu(second, "GPU-5")
    assert carried.carried_newest == NOW + 197
    assert (_sm(second, "GPU-5").last_timestamp, _sm(second, "GPU-5").max) == (NOW - 3, 0.5)  # as fetched
    assert _gpu(third, "GPU-5").stats[Window.ACTIVITY] is carried.stats[Window.ACTIVITY]  # not rebuilt
    assert _gpu(second, "GPU-0").carried_newest == NOW + 197  # rule 4 refetched it after the cycle:
    assert _gpu(third, "GPU-0").carried_newest == NOW + 197  # carried from the new entry
    assert _fb(third, "GPU-0").last_timestamp == NOW - 3  # (the model's sample time)
    assert _gpu(third, "GPU-0").stats[Window.ACTIVITY] is not _gpu(second, "GPU-0").stats[Window.ACTIVITY]

    staleness = 120.0
    fresh = gpu_activity(
        carried, carried_bounds(DataBounds(8, NOW + 200 - staleness), carried.carried_newest)
    )
    assert (fresh.signal, fresh.peak) == (Signal.SM_ACTIVE, 0.5)  # fetched 203 s ago, fresh by identity
    for gpu in model.gpus.values():
        gpu.newest = NOW + 60  # the exporter stopped: identity's newest time ages
    fourth, _ = _fetch(source, model, NOW + 260)
    stopped = _gpu(fourth, "GPU-5")
    assert stopped.carried_newest == NOW + 60
    stale = gpu_activity(
        stopped, carried_bounds(DataBounds(8, NOW + 260 - staleness), stopped.carried_newest)
    )
    assert not stale.known
    assert "stale" in stale.unknown_reason


def test_absent_identity_timestamp_is_not_carried(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].newest = None
    result, sent = _fetch(source, model, NOW + 200)
    assert "GPU-2" in set().union(*(_listed(q) for q in _activity(sent)))
    assert _sm(result, "GPU-2").last_timestamp == NOW - 3  # its own, fetched
    assert _gpu(result, "GPU-2").carried_newest is None


def test_identity_change_refreshes_in_full(model: Model) -> None:
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].pod = "new-pod"
    model.gpus["GPU-2"].fb = 5.0
    result, sent = _fetch(source, model, NOW + 200)
    full = [q for q in _activity(sent) if "FB_USED" in q]
    assert [_listed(q) for q in full] == [{"GPU-2"}]  # the new pod, in the cycle
    assert [_listed(q) for q in model.background] == [{"GPU-0"}]  # the budget's one, after it
    fb = _fb(result, "GPU-2")
    assert fb.max == 5.0


@pytest.mark.parametrize(("most", "raw"), [(8, True), (7, False)])
def test_gpu_turning_idle_is_refreshed_and_seen_idle(
    model: Model, monkeypatch: pytest.MonkeyPatch, most: int, raw: bool
) -> None:
    """Only the idle GPU's activity chain is fetched. It is read as raw samples only while a series
    holds at most MAX_RAW_SAMPLES in the window (here 120 s at a 15 s scrape: 8); past it the answer
    would grow with the samples, so Prometheus aggregates it as before, and the GPU is judged the same."""
    monkeypatch.setattr(chain_samples, "MAX_RAW_SAMPLES", most)
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].sm = 0.0
    result, sent = _fetch(source, model, NOW + 200)
    chain = [q for q in _activity(sent) if "FB_USED" not in q]
    assert [_listed(q) for q in chain] == [{"GPU-2"}]  # only its activity chain
    assert [_raw(q) for q in chain] == [raw]
    assert _sm(result, "GPU-2").max == 0.0


def test_the_chains_the_cache_names_go_out_before_identity_answers(model: Model) -> None:
    """The idle filter and the cache name most chain refreshes: they must not wait for identity,
    which only adds GPUs (here one without a newest-sample time), each asked for once."""
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].sm = 0.0
    model.gpus["GPU-3"].newest = None
    model.hold_identity = True
    result, sent = _fetch(source, model, NOW + 200)
    assert model.chain_before_identity
    chain = [_listed(q) for q in _activity(sent) if "FB_USED" not in q]
    assert chain == [{"GPU-2"}, {"GPU-3"}]  # the filter's, early; identity's, after it
    assert _sm(result, "GPU-2").max == 0.0
    assert _sm(result, "GPU-3").last_timestamp == NOW - 3  # its own, fetched
    assert (result.refreshed, result.carried) == (2, 6)


def test_carried_gpus_are_built_while_the_chains_are_in_flight_from_the_entries_judged(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The carried GPUs' Stats are made while a chain query is still unanswered, from the cache
    entries the plan judged clearly busy: a background refresh replacing one after the plan (here
    with an idle-looking window) is for the next cycles, not read by this one."""
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.gpus["GPU-2"].sm = 0.0  # its chain is fetched; the other 7 are carried
    model.hold_chain = threading.Event()
    built_while_held: list[bool] = []
    build = prom.TieredRound.build_carried

    def judged_then_replaced(state: prom.TieredRound) -> None:
        if state.carried:
            (cache,) = source.tiered.caches.values()
            taken = {("GPU-5", ""): cache.entries[("GPU-5", "")]}
            idle_rows = {Signal.SM_ACTIVE: [0.0, 0.0, 0.0, 0.0, 8.0, NOW + 197, 0.0, 0.0, 0.0]}
            assert cache.refreshed(taken, {("GPU-5", ""): idle_rows}, NOW + 200) == 1
            assert model.hold_chain is not None
            built_while_held.append(not model.hold_chain.is_set())
            build(state)
            model.hold_chain.set()
        else:
            build(state)

    monkeypatch.setattr(prom.TieredRound, "build_carried", judged_then_replaced)
    result, _ = _fetch(source, model, NOW + 200)
    assert built_while_held == [True]
    assert model.chain_released == [True]  # by the build, not after waiting 5 s
    assert (result.refreshed, result.carried) == (1, 7)
    assert _sm(result, "GPU-2").max == 0.0
    assert _sm(result, "GPU-5").max == 0.5  # the window the plan judged, not the replacement
    assert _gpu(result, "GPU-5").carried_newest == NOW - 3  # with identity's newest-sample time
    (cache,) = source.tiered.caches.values()
    assert cache.entries[("GPU-5", "")].refreshed_at == NOW + 200  # the replacement, kept for later


def _joins_while_candidates_held(model: Model, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Hold the fault candidates query until the samples are joined; returns, per join, whether
    the candidates were still held (unanswered) when it began."""
    model.hold_candidates = held = threading.Event()
    joins: list[bool] = []
    join = windows.samples

    def recorded(*args: Any, **kwargs: Any) -> Any:
        joins.append(not held.is_set())
        held.set()
        return join(*args, **kwargs)

    monkeypatch.setattr(prom, "samples", recorded)
    return joins


def test_a_steady_cycle_joins_its_samples_while_the_fault_candidates_run(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a steady cycle the samples are joined while the fault candidates query is still in
    flight (it names no GPU: that join is the cycle's), and they are those of a join made after
    it, as before: the same values, carried times and drops."""
    _busy_cluster(model, 8)
    overlapping, after = _source(model, 1), _source(model, 1)
    _fetch(overlapping, model)
    _fetch(after, model)
    model.gpus["GPU-2"].sm = 0.0  # its chain is fetched; the other 7 are carried
    joins = _joins_while_candidates_held(model, monkeypatch)
    result, sent = _fetch(overlapping, model, NOW + 200)
    assert joins == [True]  # one join, made while the candidates were unanswered
    assert sum(CANDIDATE_LABEL in q for q in sent) == 1
    monkeypatch.setattr(prom.TieredRound, "joinable", lambda self, pending: False)
    model.hold_candidates = None
    expected, _ = _fetch(after, model, NOW + 200)
    assert _values(result.gpus) == _values(expected.gpus)
    assert [g.carried_newest for g in result.gpus] == [g.carried_newest for g in expected.gpus]
    assert (result.dropped, result.refreshed, result.carried) == (expected.dropped, 1, 7)
    assert _sm(result, "GPU-2").max == 0.0


def test_a_fault_candidate_named_after_the_join_gets_its_fault_window(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Safety: when the candidates query names a GPU, the join made while it ran lacks that GPU's
    fault window; the cycle's samples are joined again once the window has come."""
    _busy_cluster(model, 8)
    source = _source(model, 1)
    _fetch(source, model)
    model.faulty = {"GPU-4": 79.0}
    joins = _joins_while_candidates_held(model, monkeypatch)
    result, sent = _fetch(source, model, NOW + 200)
    assert joins == [True, False]  # the early join, then the cycle's
    assert any('"XID:max"' in q and _listed(q) == {"GPU-4"} for q in sent)
    xid = _gpu(result, "GPU-4").get(Window.FAULT, Signal.XID)
    assert xid is not None
    assert xid.max == 79.0
    assert all(g.get(Window.FAULT, Signal.XID) is None for g in result.gpus if g.uuid != "GPU-4")
    assert (result.refreshed, result.carried) == (0, 8)


def test_the_first_cycle_joins_its_samples_after_every_answer(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache (the first cycle, a restart): nothing is joined before the candidates have
    answered (8,000 fresh windows' rows and Stats would be held at once). A scrape interval too
    short for raw samples: no early whole-window read, whose answers are taken after the rounds."""
    _busy_cluster(model, 4)
    source = _source(model, 1)
    joins = _joins_while_candidates_held(model, monkeypatch)
    assert model.hold_candidates is not None
    release = threading.Timer(0.3, model.hold_candidates.set)
    release.start()
    result, _ = _fetch(source, model, scrape_interval=0.5)
    release.join()
    assert source.tiered.early == {}
    assert joins == [False]
    assert len(result.gpus) == 4


def test_new_pods_short_windows_are_fetched_again_however_late_the_next_cycle(model: Model) -> None:
    """New pods' windows (2 samples of 8) are not carried as settled by a cycle that comes more than
    a window later (a first cycle that labelled thousands of pods; an interval longer than the
    window): that cycle fetches them whole again, and their count is the window's, not Unknown's."""
    _busy_cluster(model, 4)
    model.per_series = 2
    source = _source(model, 10)
    _fetch(source, model)
    model.per_series = 8
    later, sent = _fetch(source, model, NOW + 400)
    assert set().union(*(_listed(q) for q in _activity(sent))) in ({"*"}, set(model.gpus))
    assert [_sm(later, uuid).count for uuid in sorted(model.gpus)] == [8] * 4
    settled, sent = _fetch(source, model, NOW + 430)
    assert (settled.carried, _activity(sent)) == (4, [])


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


def test_refresh_sets_are_listed_in_queries_that_fit_and_most_gpus_go_unrestricted(model: Model) -> None:
    _busy_cluster(model, 12)
    source = _source(model, 5)
    _fetch(source, model)
    moved = sorted(model.gpus)[:5]  # key order: GPU-0, GPU-1, GPU-10, GPU-11, GPU-2
    for uuid in moved:
        model.gpus[uuid].pod = "moved"  # five re-attributed GPUs: listed
    result, sent = _fetch(source, model, NOW + 200)
    activity = _activity(sent)
    assert all(len(q.encode()) <= MAX_QUERY_BYTES for q in activity)
    assert set().union(*(_listed(q) for q in activity)) == set(moved)
    for uuid in moved:  # every aggregate of the window, for every listed GPU
        tags = {t for q in activity if uuid in _listed(q) for t in re.findall(r'"([A-Z_]+:[a-z]+)"', q)}
        assert tags == {f"{s.name}:{a}" for s, aggs in QUERY_PLAN[Window.ACTIVITY].items() for a in aggs}
    assert result.queries == 3 + len(activity)  # identity, idle and fault candidates (the inventory kept)
    (background,) = [_listed(q) for q in model.background]  # rule 4: five of the seven others, by ending
    assert background == {"GPU-3", "GPU-4", "GPU-5", "GPU-6", "GPU-7"}
    assert 'UUID=~".*(3|4|5|6|7)"' in model.background[0]
    for gpu in model.gpus.values():
        gpu.sm = 0.0  # all idle: every GPU's chain, fetched over every GPU
    result, sent = _fetch(source, model, NOW + 230)
    assert [_listed(q) for q in _activity(sent)] == [{"*"}]
    assert all("FB_USED" not in q for q in _activity(sent))
    assert (result.refreshed, result.carried, model.started) == (12, 0, 0)
    assert all(_sm(result, uuid).max == 0.0 for uuid in model.gpus)
    assert source.tiered.unlisted == {}  # most GPUs: unlisted by choice, not for lack of room


def test_a_refresh_set_too_long_to_list_is_fetched_over_every_gpu_counted_and_logged(
    model: Model, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the GPUs to list take more than MAX_ACTIVITY_QUERIES queries under the size limit,
    the cycle asks for the window over every GPU instead (the same verdicts), and says so."""
    monkeypatch.setattr(promql, "MAX_QUERY_BYTES", 2600)  # the chain over every GPU (2.2 KB) fits
    # the five GPUs' raw chain samples would take one short query: no listed query allowed here
    monkeypatch.setattr(prom, "MAX_ACTIVITY_QUERIES", 0)
    source, idle = _five_go_idle(model)
    with caplog.at_level("INFO"):
        result, sent = _fetch(source, model, NOW + 200)
    assert [_listed(q) for q in _activity(sent)] == [{"*"}]  # the chain of every GPU, one query
    assert all("FB_USED" not in q and len(q.encode()) <= 2600 for q in _activity(sent))
    assert (result.refreshed, result.carried) == (5, 7)
    assert all(_sm(result, uuid).max == 0.0 for uuid in idle)
    assert all(_sm(result, uuid).max == 0.5 for uuid in sorted(model.gpus)[5:])
    assert source.tiered.unlisted == {"activity chain": 1}
    assert (
        "too long for 0 queries of at most 2600 bytes: the activity chain fetched over every GPU"
        in caplog.text
    )
    for uuid in idle:
        model.gpus[uuid].pod = "moved"  # their whole windows now: five do not fit one query
    result, sent = _fetch(source, model, NOW + 230)
    whole = [q for q in sent if _raw(q) and "FB_USED" in q]  # over every GPU, by UUID ending
    assert _whole_buckets(whole) == set(model.gpus)
    assert all(len(q.encode()) <= 2600 for q in whole)
    assert (result.refreshed, result.carried) == (12, 0)
    assert source.tiered.unlisted == {"activity chain": 1, "whole window": 1}


def test_chain_only_queries_list_more_gpus_than_whole_windows(model: Model) -> None:
    """A chain-only query holds 18 of the whole window's 76 selectors, so each listed GPU costs it
    a quarter of the bytes: five idle GPUs' chains are one query."""
    source, idle = _five_go_idle(model)
    result, sent = _fetch(source, model, NOW + 200)
    assert [_listed(q) for q in _activity(sent)] == [set(idle)]  # one chain-only query
    assert all("FB_USED" not in q for q in _activity(sent))
    assert result.queries == 3 + 1  # identity, idle and fault candidates (the inventory kept), chains
    assert all(_sm(result, uuid).max == 0.0 for uuid in idle)


def test_the_cycle_does_not_wait_for_rule_4(model: Model) -> None:
    """Rule 4 needs nothing of the cycle's answer: the cycle returns while it is still unanswered,
    and a refresh still running when the next cycle ends makes that cycle start none."""
    _busy_cluster(model, 6)
    source = _source(model, 2)
    _fetch(source, model)
    model.release = threading.Event()
    request = FetchRequest(
        now=NOW + 200,
        windows=WINDOWS,
        scrape_interval=15.0,
        hints=HINTS,
        activity=ActivityHints(idle_below=0.01),
    )
    try:
        result = source.fetch(request)
        assert model.background == []  # nothing before the cycle starts it
        assert result.then is not None
        assert result.then() == 2
        assert (result.refreshed, result.carried) == (0, 6)
        assert not source.wait_refreshes(0.2)  # still held by the server
        again = source.fetch(replace(request, now=NOW + 230))
        assert again.then is not None
        assert again.then() == 0
    finally:
        model.release.set()
    assert source.wait_refreshes(10)
    assert [_listed(q) for q in model.background] == [{"GPU-0", "GPU-1"}]


def test_a_failed_refresh_changes_nothing(model: Model, caplog: pytest.LogCaptureFixture) -> None:
    _busy_cluster(model, 3)
    source = _source(model, 1)
    _fetch(source, model)
    model.fail_listed = True
    with caplog.at_level("WARNING"):
        _fetch(source, model, NOW + 200)
    assert "refreshing 1 cached activity windows failed" in caplog.text
    model.fail_listed = False
    model.gpus["GPU-0"].fb = 7.0
    result, _ = _fetch(source, model, NOW + 230)
    assert _fb(result, "GPU-0").max == 1000.0  # still the cached figure; GPU-0 is still the oldest
    assert [_listed(q) for q in model.background] == [{"GPU-0"}]


def test_one_shot_commands_get_an_empty_cache(model: Model) -> None:
    """report/explain build a new source with budget 0; a new source with a budget starts empty."""
    _busy_cluster(model, 2)
    result, sent = _fetch(_source(model, 1), model)
    assert result.carried == 0
    assert _whole_buckets(_activity(sent)) == set(model.gpus)
    assert math.isfinite(_sm(result, "GPU-0").max)


def _request(now: float = NOW) -> FetchRequest:
    return FetchRequest(
        now=now, windows=WINDOWS, scrape_interval=15.0, hints=HINTS, activity=ActivityHints(idle_below=0.01)
    )


def test_an_empty_caches_whole_window_goes_out_before_identity_answers(model: Model) -> None:
    """Every GPU is new to an empty cache, so its whole window is read whatever identity says: the
    buckets must not wait for it (the restart's longest read, early_window.py)."""
    _busy_cluster(model, 6)
    model.gpus["GPU-5"].sm = 0.0
    model.hold_identity_for_whole = True
    result, sent = _fetch(_source(model, 1), model)
    assert model.whole_before_identity
    assert _whole_buckets(_activity(sent)) == set(model.gpus)  # each bucket once
    assert result.queries == len(sent) == 4 + len(_activity(sent))
    today = _plain(model).fetch(FetchRequest(now=NOW, windows=WINDOWS, scrape_interval=15.0, hints=HINTS))
    assert _values(result.gpus) == _values(today.gpus)


def test_a_cycles_early_read_is_taken_by_its_fetch_and_each_bucket_sent_once(model: Model) -> None:
    """The cycle starts the read before it reads the nodes (``read_early``); the fetch at the same
    time takes its answers instead of asking again, and a second early call starts nothing."""
    _busy_cluster(model, 6)
    source = _source(model, 1)
    source.read_early(replace(_request(), hints=None))
    source.read_early(replace(_request(), hints=None))
    early = source.tiered.early[(120.0, "")]
    assert len(early.answers()) == len(chain_samples.WHOLE_BUCKETS) + 1  # all in before the fetch
    model.cycle.clear()
    model.gpus["GPU-0"].sm = 0.9  # moved after the early read: the fetch must not read it again
    result = source.fetch(_request())
    assert _activity(model.cycle) == []  # the buckets came from the early read
    assert len(model.cycle) == 4  # identity, idle and fault candidates, inventory
    assert result.queries == 4 + len(early.queries)
    assert _sm(result, "GPU-0").max == 0.5
    assert source.tiered.early == {}
    model.gpus["GPU-0"].sm = 0.5
    fresh = _fetch(_source(model, 1), model)[0]
    assert _values(result.gpus) == _values(fresh.gpus)


def test_an_early_read_for_another_time_is_dropped(model: Model) -> None:
    """An early read is taken only by the fetch at its evaluation time (a failed cycle's read is
    not carried to the next one): the fetch reads the window again, at its own time."""
    _busy_cluster(model, 4)
    source = _source(model, 1)
    source.read_early(replace(_request(NOW - 30), hints=None))
    source.tiered.early[(120.0, "")].answers()
    model.gpus["GPU-0"].sm = 0.7
    model.times.clear()
    result, sent = _fetch(source, model)
    assert _whole_buckets(_activity(sent)) == set(model.gpus)
    assert _sm(result, "GPU-0").max == 0.7
    assert all(float(t) == NOW for t in model.times)


def test_no_early_read_once_the_cache_holds_windows(model: Model) -> None:
    """After the first cycle the cache decides what is read: an early call sends nothing."""
    _busy_cluster(model, 4)
    source = _source(model, 1)
    _fetch(source, model)
    model.queries.clear()
    source.read_early(replace(_request(NOW + 200), hints=None))
    assert source.tiered.early == {}
    assert model.queries == []


def test_no_early_read_without_a_budget_or_for_a_window_too_long_for_raw_samples(model: Model) -> None:
    """Without a refresh budget, or where the window is aggregated by Prometheus (``raw_fits``), the
    fetch sends its own queries as before: nothing is read early."""
    _busy_cluster(model, 2)
    _plain(model).read_early(_request())
    source = _source(model, 1)
    long_window = replace(_request(), windows={**WINDOWS, Window.ACTIVITY: 121 * 15.0})
    source.read_early(long_window)
    assert source.tiered.early == {}
    assert model.queries == []


def test_a_failed_early_read_fails_the_fetch_as_its_own_query_would(model: Model) -> None:
    """A bucket that fails fails the fetch (the window is missing: Unknown, never idle), as the same
    query sent by the fetch would; the next cycle reads the window again."""
    _busy_cluster(model, 3)
    source = _source(model, 1)
    model.fail_whole = True
    source.read_early(replace(_request(), hints=None))
    with pytest.raises(SourceUnavailable, match="query timed out"):
        source.fetch(_request())
    assert source.tiered.early == {}
    model.fail_whole = False
    result, sent = _fetch(source, model, NOW + 30)
    assert _whole_buckets(_activity(sent)) == set(model.gpus)
    assert (result.refreshed, result.carried) == (3, 0)


def test_an_early_read_the_plan_does_not_ask_for_is_cancelled(model: Model) -> None:
    """No GPU in identity: the plan asks for no whole window, so the early read sends no more
    buckets than those already in flight, and the fetch does not wait for them."""
    source = _source(model, 1)
    model.hold_whole = threading.Event()
    source.read_early(replace(_request(), hints=None))
    early = source.tiered.early[(120.0, "")]
    deadline = time.monotonic() + 5  # both buckets in flight (a bucket not yet started is not sent)
    while len([q for q in model.queries if _raw(q)]) < chain_samples.WHOLE_IN_FLIGHT:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        result = source.fetch(_request())
        assert result.gpus == ()
        assert source.tiered.early == {}
    finally:
        model.hold_whole.set()
    with pytest.raises(RuntimeError, match="cancelled"):
        early.answers()
    whole = [q for q in model.queries if _raw(q) and "FB_USED" in q]
    assert len(whole) == chain_samples.WHOLE_IN_FLIGHT
