"""The tiered fetch of the activity window (``--prometheus-refresh-budget``; the rules are in
``sources/metrics/prometheus/tiered/activity_cache.py``): identity, idle and fault candidates first, then only the refresh
set's activity windows, in listed queries that each fit ``promql.MAX_QUERY_BYTES`` (VictoriaMetrics'
default 16 KiB); the rest carried from the cache, and the budget's least recently refreshed GPUs,
selected by UUID ending, fetched in the background after the cycle.

In a steady cycle (the cache holds windows) the samples are joined as soon as only the fault
candidates query is still in flight (``TieredRound.joinable``), rather than after its answer: it
usually answers last and names no GPU. A candidate named (a fault) brings its fault windows, and
the samples are joined again with them.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.sources.metrics.base import DropTally, FetchRequest, FetchResult, SourceUnavailable
from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus import promql
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.inventory_cache import InventoryRound
from gpu_efficiency.sources.metrics.prometheus.promql import (
    MAX_WINDOW_PARTS,
    Query,
    fitting_window_queries,
    identity_query,
    idle_candidates_query,
    listed_window_queries,
)
from gpu_efficiency.sources.metrics.prometheus.regex_lists import ending_alternatives, uuid_alternatives
from gpu_efficiency.sources.metrics.prometheus.tiered.activity_cache import (
    ActivityCache,
    Entry,
    Key,
    RefreshPlan,
    Seen,
    early_chain,
    everything,
    oldest_cached,
    plan_refresh,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.chain_samples import (
    WHOLE_IN_FLIGHT,
    chain_sample_queries,
    raw_fits,
    whole_sample_queries,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.early_window import EarlyWindow
from gpu_efficiency.sources.metrics.prometheus.windows import (
    Overlay,
    Rows,
    WindowValues,
    merge_window,
    samples,
)
from gpu_efficiency.sources.metrics.prometheus.xid_counts import XidEvents

if TYPE_CHECKING:
    from gpu_efficiency.sources.metrics.prometheus.source import PrometheusSource

log = logging.getLogger(__name__)

NO_IDENTITY = "Prometheus answered no identity or idle-candidates query"


class TieredFetch:
    """A source's activity caches (one per window length and matchers) and its tiered fetch."""

    def __init__(self, source: PrometheusSource) -> None:
        self.source = source
        self.caches: dict[tuple[float, str], ActivityCache] = {}
        self._cache_lock = threading.Lock()
        #: Whole-window reads started before their fetch (``early_window.py``), by cache key.
        self.early: dict[tuple[float, str], EarlyWindow] = {}
        #: Cycles whose refresh set was too large to list, by what was fetched over every GPU instead.
        self.unlisted: Counter[str] = Counter()

    def fetch(self, request: FetchRequest, idle_below: float) -> FetchResult:
        """``PrometheusSource.fetch`` with the activity window refreshed only where it matters (activity_cache.py):
        identity (with newest-sample times), idle candidates and fault candidates first; then the
        activity window of the refresh set, in listed queries run concurrently (the chains
        the idle filter and the cache name as soon as the filter answers, beside identity). The refresh
        budget's whole windows for later cycles (rule 4) are the result's ``then``. An empty
        cache's whole window starts at once, beside identity, unless the cycle started it earlier
        (``read_early``). In a steady cycle the samples are joined while the fault candidates
        query finishes (the module's docstring)."""
        started = time.monotonic()
        source = self.source
        matchers = source.config.matchers
        seconds = request.windows[Window.ACTIVITY]
        early = self._early(request, seconds)
        queries = [
            identity_query(matchers, timestamps=True),
            idle_candidates_query(seconds, idle_below, matchers),
        ]
        state = TieredRound(inventory=source.inventory_round(request))
        queries += [
            q
            for q in source.first_round(request, state.inventory)
            if q.candidates or q.inventory or q.xid_counts or q.window not in (None, Window.ACTIVITY)
        ]
        cache = self._cache(seconds)
        state.overlap = bool(cache.entries) and early is None  # a steady cycle (``joinable``)
        drops = DropTally()
        settle_s = seconds + 2 * request.scrape_interval
        raw = raw_fits(seconds, request.scrape_interval)

        def take(query: Query, result: Any) -> list[Query]:
            more = state.take(query, result) + source.fault_windows(query, result, request)
            if query.idle and state.identity is None:  # the chains the cache already names: now
                with self._cache_lock:
                    uuids = early_chain(cache.entries, result, idle_below)
                    cached = len({uuid for uuid, _ in cache.entries})
                chunks = listed_activity(uuids, seconds, matchers, chain_only=True, raw=raw)
                if chunks is not None and worth_listing(len(chunks), len(uuids), cached):
                    state.early, more = uuids, more + chunks
            if state.plan is None and state.identity is not None and state.idle is not None:
                with self._cache_lock:
                    plan = plan_refresh(cache.entries, state.seen, state.idle, idle_below, settle_s=settle_s)
                    # the entries the plan judged: a background refresh may replace them from now on
                    carried = {key: cache.entries[key] for key in plan.carried}
                state.plan, activity = activity_queries(plan, state.seen, seconds, matchers, state.early, raw)
                self._count_unlisted(state.plan)
                state.carried = {key: carried[key] for key in state.plan.carried}
                state.waiting = [q for q in activity if q.whole]  # WHOLE_IN_FLIGHT at a time
                if early is not None and state.waiting == early.queries:  # read already: take it
                    state.prefetched, state.waiting = early, []
                elif early is not None:
                    early.cancel()
                more += [q for q in activity if not q.whole] + state.next_whole(WHOLE_IN_FLIGHT)
            elif query.whole:
                more += state.next_whole(1)
            return more

        def meanwhile(pending: Collection[Query]) -> None:
            state.build_carried()
            if state.joined is None and state.joinable(pending):
                joined = DropTally()
                state.joined = self._join(state, cache, request, joined, keep=True), joined

        with gc_paused():
            try:
                sent = source.run_rounds(
                    queries,
                    request.now,
                    take,
                    workers=ACTIVITY_WORKERS + 8 + 2 * MAX_WINDOW_PARTS,
                    meanwhile=meanwhile,
                    drops=drops,
                )
                if state.identity is None or state.plan is None:
                    raise SourceUnavailable(NO_IDENTITY)
                if state.prefetched is not None:
                    for query, answer in state.prefetched.answers():
                        state.take(query, answer)
                    sent += len(state.prefetched.queries)
            finally:
                if early is not None:
                    early.cancel()
            plan = state.plan
            if state.joined is not None and not state.windows:  # joined while the candidates ran
                gpus, joined = state.joined
                for reason, count in joined.counts().items():
                    drops.add(reason, count)
            else:
                gpus = self._join(state, cache, request, drops, keep=False)
        log.debug(
            "activity window: %d in full%s, %d chain only%s (new %d, idle %d, not busy %d, settling %d),"
            " %d carried, %d queries",
            len(plan.full),
            " (unrestricted)" if plan.unrestricted else "",
            len(plan.chain),
            " (over every GPU)" if plan.chain_unlisted else "",
            plan.new,
            plan.idle,
            plan.not_busy,
            plan.settling,
            len(plan.carried),
            sent,
        )
        return FetchResult(
            gpus=gpus,
            queries=sent,
            seconds=time.monotonic() - started,
            refreshed=len(plan.refresh),
            carried=len(plan.carried),
            then=functools.partial(self.after_cycle, cache, request.now, settle_s, seconds, state.identity),
            dropped=drops.counts(),
        )

    def _join(
        self, state: TieredRound, cache: ActivityCache, request: FetchRequest, drops: DropTally, keep: bool
    ) -> tuple[GPUSample, ...]:
        """Store the cycle's activity windows in the cache (once) and join them with identity into
        the cycle's samples (``windows.samples``). ``keep``: join copies of the fetched rows and
        carried Stats, so that the same join can be made again from the same inputs (a join made
        while the fault candidates were in flight is dropped when they name a GPU)."""
        plan, identity, seconds = state.plan, state.identity, request.windows[Window.ACTIVITY]
        if plan is None or identity is None:
            raise SourceUnavailable(NO_IDENTITY)
        state.build_carried()
        with self._cache_lock:
            if not state.stored:
                scrape = request.scrape_interval
                full_count = seconds / scrape - 1 if scrape > 0 else math.inf
                cache.update(state.seen, plan, state.fresh, request.now, full_count)
                state.stored = True
            reused = cache.reused_rows(plan, state.seen, carried=False)
            whole = cache.whole_stats(plan)
        fresh = dict(state.fresh) if keep else state.fresh
        windows: dict[Window, Rows] = {**state.windows, Window.ACTIVITY: Overlay(reused, fresh)}
        return samples(
            identity,
            windows,
            request,
            built={Window.ACTIVITY: dict(state.built) if keep else state.built},
            whole={Window.ACTIVITY: whole},
            views=state.inventory.result(),
            xids=state.xids,
            drops=drops,
        )

    def read_early(self, request: FetchRequest) -> None:
        """Start reading every GPU's whole activity window at ``request.now`` when the cache of its
        window is empty and the window is read as raw samples (``early_window.py``): the fetch at
        the same time takes it. One read per cache: a second call for the same time starts none."""
        seconds = request.windows.get(Window.ACTIVITY, 0.0)
        if seconds <= 0 or not raw_fits(seconds, request.scrape_interval):
            return
        matchers = self.source.config.matchers
        cache = self._cache(seconds)
        with self._cache_lock:
            running = self.early.get((seconds, matchers))
            if cache.entries or (running is not None and running.at == request.now):
                return
            queries = whole_sample_queries(seconds, matchers)
            if not queries:
                return
            if running is not None:
                running.cancel()
            self.early[(seconds, matchers)] = EarlyWindow(self.source.run, request.now, queries)
        log.debug("reading every GPU's activity window early: %d queries", len(queries))

    def _early(self, request: FetchRequest, seconds: float) -> EarlyWindow | None:
        """This fetch's early whole-window read (started now if the caller did not): None when the
        cache is not empty; one started for another time is cancelled and dropped."""
        self.read_early(request)
        with self._cache_lock:
            early = self.early.pop((seconds, self.source.config.matchers), None)
        if early is not None and early.at != request.now:
            early.cancel()
            return None
        return early

    def after_cycle(
        self,
        cache: ActivityCache,
        at: float,
        settle_s: float,
        seconds: float,
        identity: Mapping[GPUKey, Identity] | None,
    ) -> int:
        """The tiered fetch's ``FetchResult.then``: rule 4's refresh (``refresh_oldest``: its count
        returned), and the exporter inventory's when the kept read is old (``inventory_cache.py``)."""
        started = self.refresh_oldest(cache, at, settle_s, seconds)
        if identity is not None:
            self.source.refresh_inventory(at, identity)
        return started

    def refresh_oldest(self, cache: ActivityCache, at: float, settle_s: float, seconds: float) -> int:
        """Rule 4 (activity_cache.py; after the cycle: ``after_cycle``): start fetching, in the
        background, the whole windows at ``at`` of the refresh budget's least recently refreshed
        GPUs. One refresh per cache at a time: one still running when the next cycle ends
        (Prometheus slower than the interval) makes that cycle start none. Returns how many GPUs it
        started refreshing."""
        with self._cache_lock:
            running = cache.refresh
            if running is not None and running.is_alive():
                return 0
            taken, endings = oldest_cached(cache.entries, self.source.refresh_budget, at, settle_s)
            if not taken:
                return 0
            chunks = bucket_queries(endings, seconds, self.source.config.matchers)
            if chunks is None:
                log.warning(
                    "the refresh budget's activity query does not fit %d bytes: not sent",
                    promql.MAX_QUERY_BYTES,
                )
                return 0
            cache.refresh = threading.Thread(
                target=self._store_refresh,
                args=(cache, taken, chunks, at),
                name="prometheus-refresh",
                daemon=True,
            )
            cache.refresh.start()
        return len(taken)

    def _store_refresh(
        self, cache: ActivityCache, taken: dict[Key, Entry], chunks: list[Query], at: float
    ) -> None:
        fresh: WindowValues = {}
        try:
            with gc_paused():
                for query in chunks:
                    for key, rows in self.source.run(query, at).items():
                        fresh.setdefault(key, {}).update(rows)
        except Exception as exc:  # a failed refresh changes nothing: the entries are just older
            log.warning("refreshing %d cached activity windows failed: %s", len(taken), exc)
            return
        with self._cache_lock:
            stored = cache.refreshed(taken, fresh, at)
        log.debug("refreshed %d of %d cached activity windows (%d queries)", stored, len(taken), len(chunks))

    def _count_unlisted(self, plan: RefreshPlan) -> None:
        """Count and log a cycle whose refresh set took more than MAX_ACTIVITY_QUERIES listed
        queries under ``MAX_QUERY_BYTES`` (``activity_queries``): fetched over every GPU instead."""
        if not plan.too_long:
            return
        what = "whole window" if plan.unrestricted else "activity chain"
        self.unlisted[what] += 1
        log.info(
            "activity refresh (%d GPUs in full, %d chains) too long for %d queries of at most %d bytes:"
            " the %s fetched over every GPU (%d cycles so far)",
            len(plan.full),
            len(plan.chain),
            MAX_ACTIVITY_QUERIES,
            promql.MAX_QUERY_BYTES,
            what,
            self.unlisted[what],
        )

    def wait_refreshes(self, timeout: float | None = None) -> bool:
        """Wait for the background refreshes started so far (tests and benchmarks);
        False if one is still running after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cache_lock:
            running = [c.refresh for c in self.caches.values() if c.refresh is not None]
        for thread in running:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in running)

    def _cache(self, seconds: float) -> ActivityCache:
        """The activity cache of this window length (policies may differ); a few kept at most."""
        key = (seconds, self.source.config.matchers)
        with self._cache_lock:
            cache = self.caches.get(key)
            if cache is None:
                while len(self.caches) >= MAX_CACHED_WINDOWS:
                    del self.caches[next(iter(self.caches))]
                cache = self.caches[key] = ActivityCache()
            return cache


@dataclass
class TieredRound:
    """What a tiered fetch has received so far; the refresh plan is made once identity and the idle
    candidates are both in."""

    inventory: InventoryRound
    identity: dict[GPUKey, Identity] | None = None
    idle: set[Key] | None = None
    seen: dict[Key, Seen] = field(default_factory=dict)
    plan: RefreshPlan | None = None
    windows: dict[Window, Rows] = field(default_factory=dict)
    fresh: WindowValues = field(default_factory=dict)
    early: frozenset[str] = frozenset()  # UUIDs whose chain was asked for before identity answered
    carried: dict[Key, Entry] = field(default_factory=dict)  # the plan's carried GPUs, as it judged them
    built: dict[Key, dict[Signal, Stats]] = field(default_factory=dict)  # their Stats (build_carried)
    xids: XidEvents = field(
        default_factory=dict
    )  # XID events counted (sources/metrics/prometheus/xid_counts.py)
    waiting: list[Query] = field(default_factory=list)  # whole-window buckets not asked for yet
    prefetched: EarlyWindow | None = None  # the whole window read before the plan (early_window.py)
    #: A steady cycle: the cache held windows and no early whole window is read (so none is
    #: ``prefetched``); only then may ``joinable`` say yes.
    overlap: bool = False
    #: The samples joined while only the fault candidates were in flight, with their drops.
    joined: tuple[tuple[GPUSample, ...], DropTally] | None = None
    stored: bool = False  # the cycle's windows are in the activity cache (``TieredFetch._join``)

    def joinable(self, pending: Collection[Query]) -> bool:
        """Can a steady cycle's samples be joined now? Everything they are made of is in
        (identity, the plan, every activity window, the inventory and the XID counts) and only the
        fault candidates query is still in flight: the filter over every GPU's fault signals
        usually answers last and names no GPU, so the join (~0.3 s of the operator's CPU at 8,000
        GPUs) runs while Prometheus finishes it instead of after. If it names one, its fault
        windows follow and the join is made again with them (``TieredFetch.fetch``). Not after a
        restart: that join of 8,000 fresh windows would hold their rows and Stats at once."""
        return (
            self.overlap
            and self.identity is not None
            and self.plan is not None
            and not self.waiting
            and not self.windows
            and bool(pending)
            and all(q.candidates for q in pending)
        )

    def next_whole(self, count: int) -> list[Query]:
        """The next ``count`` whole-window buckets to ask for (``chain_samples.WHOLE_IN_FLIGHT``)."""
        taken, self.waiting = self.waiting[:count], self.waiting[count:]
        return taken

    def build_carried(self) -> None:
        """The carried GPUs' activity Stats, from the entries the plan judged: each entry's own
        (``Entry.stats``, built once per entry and then kept), taken while the chains and the fault
        candidates are still in flight. ``samples`` marks them carried, with identity's newest time."""
        if not self.carried:
            return
        for key, entry in self.carried.items():
            self.built[key] = entry.stats()
        self.carried = {}

    def take(self, query: Query, result: Any) -> list[Query]:
        """Keep an answer; the queries it makes necessary (the inventory, when identity names a
        changed GPU)."""
        if query.window is Window.ACTIVITY:
            for key, rows in result.items():  # chunks list disjoint UUIDs; merged all the same
                self.fresh.setdefault(key, {}).update(rows)
        elif query.window is not None:
            self.windows[query.window] = merge_window(self.windows.get(query.window), result)
        elif query.idle:
            self.idle = result
        elif query.inventory:
            self.inventory.views = result
        elif query.xid_counts:
            self.xids = result
        elif not query.candidates:
            self.identity = result
            self.seen = {
                (k.uuid, k.instance_id): Seen(i.node, frozenset(i.pods), i.newest) for k, i in result.items()
            }
            return self.inventory.after_identity(result)
        return []


#: The most listed activity queries of one cycle (each under ``MAX_QUERY_BYTES``): beyond them (or
#: half the GPUs) the window is fetched over every GPU. A UUID costs ~3.1 KB of a whole window's
#: query (~0.7 KB of a chain's), so 64 queries hold ~240 whole windows or ~1,200 chains. Measured
#: on the local cluster (bench/scale/RESULTS.md, "The tiered refresh under 16 KiB"): a 16 KiB listed
#: query costs Prometheus 3.10 1.7-3.4 ms CPU beyond its series (VictoriaMetrics 0.5 ms), a listed
#: GPU 1.5-2x its share of the unrestricted window (~1.5-2.5 ms a GPU: 20 s at 8,000), so 64
#: queries (~0.2 s) stay far below the unrestricted window at thousands of GPUs.
MAX_ACTIVITY_QUERIES = 64
#: Listed activity queries in flight at once (as many as before they were cut to 16 KiB): more
#: queue in the operator, not at the backend (VictoriaMetrics answers 429 past its
#: ``-search.maxConcurrentRequests``, twice its cores by default).
ACTIVITY_WORKERS = 8
#: Activity caches kept per source (one per distinct window length among the policies).
MAX_CACHED_WINDOWS = 4


def worth_listing(queries: int, listed: int, total: int) -> bool:
    """Is fetching ``listed`` of ``total`` GPUs' activity in ``queries`` listed queries cheaper than
    the unrestricted query? Not beyond MAX_ACTIVITY_QUERIES queries or half the GPUs."""
    return queries <= MAX_ACTIVITY_QUERIES and 2 * listed <= total


def listed_activity(
    uuids: Collection[str], seconds: float, matchers: str, chain_only: bool = False, raw: bool = False
) -> list[Query] | None:
    """The activity window of these UUIDs (their chain only; with ``raw``, as raw samples:
    ``chain_samples.py``), each query under ``MAX_QUERY_BYTES``; None when more than
    MAX_ACTIVITY_QUERIES would be needed (or nothing fits)."""
    if not uuids:
        return []
    if chain_only and raw:  # each UUID listed once, not in every aggregate's selector
        queries = chain_sample_queries(uuids, seconds, matchers)
    else:
        queries = listed_window_queries(
            Window.ACTIVITY, seconds, uuid_alternatives(uuids), matchers, chain_only=chain_only
        )
    return queries if queries is not None and len(queries) <= MAX_ACTIVITY_QUERIES else None


def bucket_queries(endings: Collection[str] | None, seconds: float, matchers: str) -> list[Query] | None:
    """Rule 4's whole windows of the GPUs whose UUID ends in one of ``endings`` (None: every GPU):
    a few bytes per bucket, however many GPUs it holds."""
    if endings is None:
        return listed_window_queries(Window.ACTIVITY, seconds, None, matchers)
    pieces, around = ending_alternatives(endings)
    return listed_window_queries(Window.ACTIVITY, seconds, pieces, matchers, around=around)


def whole_window_queries(seconds: float, matchers: str, raw: bool) -> list[Query]:
    """The activity window of every GPU (a restart's first cycle, or most GPUs changed): with
    ``raw``, as raw samples by UUID ending (``chain_samples.whole_sample_queries``: a quarter of
    Prometheus' work for the same rows), else Prometheus' aggregates."""
    queries = whole_sample_queries(seconds, matchers) if raw else None
    return queries or fitting_window_queries(Window.ACTIVITY, seconds, matchers)


def activity_queries(
    plan: RefreshPlan,
    seen: Mapping[Key, Seen],
    seconds: float,
    matchers: str,
    chains_sent: Collection[str] = frozenset(),
    raw: bool = True,
) -> tuple[RefreshPlan, list[Query]]:
    """The activity queries of a refresh plan, each under ``MAX_QUERY_BYTES``: full windows and
    chain-only windows of its UUIDs (those of ``chains_sent`` already asked for: ``early_chain``;
    with ``raw``, the chains as raw samples: ``chain_samples.raw_fits``).
    When the full windows take too many queries or are most GPUs, the full window over every GPU
    (the plan widened to all: ``whole_window_queries``, built only then); when only the chains do,
    the chain-only window over every GPU, its answer kept for the plan's chain GPUs (a fifth of the
    whole window's terms)."""
    total = len({uuid for uuid, _ in seen})
    full = {uuid for uuid, _ in plan.full}
    chain = {uuid for uuid, _ in plan.chain} - set(chains_sent)
    if 2 * len(full) > total:
        return everything(seen, plan), whole_window_queries(seconds, matchers, raw)
    listed = listed_activity(full, seconds, matchers)
    if listed is None:
        return replace(everything(seen, plan), too_long=True), whole_window_queries(seconds, matchers, raw)
    chains = listed_activity(chain, seconds, matchers, chain_only=True, raw=raw)
    if chains is not None and worth_listing(len(listed) + len(chains), len(chain), total):
        return plan, [*listed, *chains]
    every = listed_window_queries(Window.ACTIVITY, seconds, None, matchers, chain_only=True, keys=plan.chain)
    if every is None:  # matchers too long even for the chain alone: as the default path does
        return everything(seen, plan), whole_window_queries(seconds, matchers, raw)
    return replace(plan, chain_unlisted=True, too_long=2 * len(chain) <= total), [*listed, *every]
