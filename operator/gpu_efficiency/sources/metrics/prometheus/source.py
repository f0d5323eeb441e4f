"""The Prometheus source: per-GPU window aggregates from dcgm-exporter (or node-agent) series.

A constant number of PromQL queries per cycle (``sources/metrics/prometheus/promql.py``), run concurrently through one
``PrometheusClient`` (``transport.py``); window answers are folded as they stream in
(``windows.py``). With a refresh budget the activity window is fetched tiered (``tiered/fetch.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import httpx

from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.model import Window
from gpu_efficiency.sources.metrics.base import DropTally, FetchRequest, FetchResult
from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus import answers, exporter_inventory, xid_counts
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.inventory_cache import InventoryCache, InventoryRound
from gpu_efficiency.sources.metrics.prometheus.link_check import LinkCheck
from gpu_efficiency.sources.metrics.prometheus.promql import (
    FILTERED_WINDOWS,
    MAX_WINDOW_PARTS,
    Query,
    candidates_query,
    cycle_queries,
    restricted_queries,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.chain_samples import (
    decode_matrix,
    fold_chain_samples,
    fold_whole_samples,
)
from gpu_efficiency.sources.metrics.prometheus.tiered.fetch import TieredFetch
from gpu_efficiency.sources.metrics.prometheus.transport import PrometheusClient, PrometheusConfig
from gpu_efficiency.sources.metrics.prometheus.vector import iter_vector
from gpu_efficiency.sources.metrics.prometheus.windows import (
    Rows,
    TrustedRows,
    WindowValues,
    fold_target_window,
    fold_window,
    merge_window,
    samples,
)


class PrometheusSource:
    """A SampleSource issuing a constant number of PromQL queries per cycle."""

    def __init__(
        self,
        config: PrometheusConfig,
        refresh_budget: int = 0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``refresh_budget`` > 0 turns on the tiered refresh of the activity window (see
        ``sources/metrics/prometheus/tiered/activity_cache.py``): new, changed and possibly idle GPUs plus that many least
        recently refreshed ones fetched fresh per cycle, the rest carried from earlier cycles.
        0: every GPU every cycle. ``transport``: the client's (``PrometheusClient``)."""
        self.refresh_budget = refresh_budget
        self.client = PrometheusClient(config, transport=transport)
        self.tiered = TieredFetch(self)
        self.inventory = InventoryCache()
        self.links = LinkCheck()

    @property
    def config(self) -> PrometheusConfig:
        """The client's settings: one copy, read at each query (the session is made once)."""
        return self.client.config

    @config.setter
    def config(self, config: PrometheusConfig) -> None:
        self.client.config = config

    def query(self, text: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Run one instant query (``PrometheusClient.query``)."""
        return self.client.query(text, at)

    def window_values(self, query: Query, at: float | None = None) -> WindowValues | TrustedRows:
        """Run a window query, folding its series as they stream in (see ``iter_vector``);
        SourceUnavailable as soon as more than ``max_series`` series have come. A fault window's
        series stay apart per scrape target (``TrustedRows``: ``samples`` picks the trusted ones)."""
        cap, keys = self.config.max_series, query.keys
        if query.window in FILTERED_WINDOWS:
            values = self.client.exchange(
                query.text, at, lambda chunks: fold_target_window(iter_vector(chunks), cap)
            )
            return TrustedRows(values if keys is None else {k: v for k, v in values.items() if k in keys})
        if query.samples:  # raw samples: a listed chain, or one bucket of the whole window; read whole
            fold = fold_whole_samples if query.whole else fold_chain_samples
            rows = self.client.exchange(
                query.text, at, lambda chunks: fold(decode_matrix(b"".join(chunks), cap))
            )
        else:
            rows = self.client.exchange(query.text, at, lambda chunks: fold_window(iter_vector(chunks), cap))
        return rows if keys is None else {k: v for k, v in rows.items() if k in keys}

    def run(self, query: Query, at: float, drops: DropTally | None = None) -> Any:
        """What the fetch needs from one query: identities, candidates or a window's values.
        Series naming a malformed GPU identifier are dropped (and counted in ``drops``): listed in a
        later query's regex, one of them used to make Prometheus reject the whole fetch."""
        if query.window is not None:
            return self.window_values(query, at)
        series = self.query(query.text, at)
        drops = drops if drops is not None else DropTally()
        if query.idle:
            return answers.idle_keys(series, drops)
        if query.inventory:
            return exporter_inventory.inventory(series, drops)
        if query.xid_counts:
            return xid_counts.events(series, drops)
        return answers.candidates(series, drops) if query.candidates else answers.identities(series, drops)

    def inventory_round(self, request: FetchRequest) -> InventoryRound:
        """This fetch's use of the kept exporter inventory (``inventory_cache.py``)."""
        return InventoryRound(self.inventory, request.now, self.config.matchers)

    def refresh_inventory(self, at: float, identity: Mapping[GPUKey, Identity]) -> int:
        """After a cycle (``FetchResult.then``): read the exporter inventory at ``at`` in the
        background when the kept read is older than ``INVENTORY_REFRESH_S`` (``inventory_cache.py``).
        Returns 1 when a read was started."""
        matchers = self.config.matchers
        query = exporter_inventory.query(matchers)
        return int(self.inventory.refresh(lambda: self.run(query, at), identity, at, matchers))

    def first_round(self, request: FetchRequest, inventory: InventoryRound) -> list[Query]:
        """Identity, the inventory (when due), the unfiltered windows and (with hints) the fault
        candidates query."""
        matchers, hints = self.config.matchers, request.hints
        if hints is None:
            return [*cycle_queries(request.windows, matchers), *inventory.first()]
        # filtered windows come second, for the GPUs the candidates query names
        queries = [
            q for q in cycle_queries(request.windows, matchers, hints) if q.window not in FILTERED_WINDOWS
        ]
        links = self.links.due(request.now, matchers, request.windows.get(Window.FAULT, 0.0))
        candidates = candidates_query(request.windows, hints, matchers, links)
        if candidates is not None:
            queries.append(candidates)
        queries += inventory.first()
        counted = xid_counts.query(hints.xid_windows, matchers)
        if counted is not None:
            queries.append(counted)
        return queries

    def _tiered(self, request: FetchRequest) -> bool:
        """Is the activity window fetched tiered (a refresh budget, an activity window and its hints)?"""
        has_window = request.windows.get(Window.ACTIVITY, 0.0) > 0
        return self.refresh_budget > 0 and has_window and request.activity is not None

    def read_early(self, request: FetchRequest) -> None:
        """Start the tiered fetch's whole-window read of an empty cache before the cluster is read
        (``tiered/early_window.py``); nothing without a refresh budget (``base.EarlyReads``)."""
        if self._tiered(request):
            self.tiered.read_early(request)

    def fetch(self, request: FetchRequest) -> FetchResult:
        if self._tiered(request) and request.activity is not None:
            return self.tiered.fetch(request, request.activity.idle_below)
        started = time.monotonic()
        identity: dict[GPUKey, Identity] = {}
        windows: dict[Window, Rows] = {}
        inventory = self.inventory_round(request)
        xids: xid_counts.XidEvents = {}
        drops = DropTally()

        def take(query: Query, result: Any) -> list[Query]:
            nonlocal identity, xids
            if query.window is not None:
                windows[query.window] = merge_window(windows.get(query.window), result)
            elif query.inventory:
                inventory.views = result
            elif query.xid_counts:
                xids = result
            elif not query.candidates:
                identity = result
                return inventory.after_identity(result)
            return self.fault_windows(query, result, request)

        with gc_paused():
            queries = self.first_round(request, inventory)
            # later rounds: the inventory after identity, the fault windows' parts
            later = 1 + len(FILTERED_WINDOWS) * MAX_WINDOW_PARTS
            sent = self.run_rounds(queries, request.now, take, workers=len(queries) + later, drops=drops)
            gpus = samples(identity, windows, request, views=inventory.result(), xids=xids, drops=drops)
        return FetchResult(
            gpus=gpus,
            queries=sent,
            seconds=time.monotonic() - started,
            then=functools.partial(self.refresh_inventory, request.now, identity),
            dropped=drops.counts(),
        )

    def run_rounds(
        self,
        queries: list[Query],
        at: float,
        take: Callable[[Query, Any], list[Query]],
        *,
        workers: int,
        meanwhile: Callable[[Collection[Query]], None] | None = None,
        drops: DropTally | None = None,
    ) -> int:
        """Run ``queries`` concurrently; ``take`` gets each answer as it arrives and returns the
        queries it makes necessary (a later round), which run on the same pool; ``meanwhile`` is
        called with the queries still in flight whenever some are after that. Returns how many
        were sent."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending = {pool.submit(self.run, q, at, drops): q for q in queries}
            sent = len(pending)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    for more in take(pending.pop(future), future.result()):
                        pending[pool.submit(self.run, more, at, drops)] = more
                        sent += 1
                if pending and meanwhile is not None:
                    meanwhile(pending.values())
        return sent

    def fault_windows(self, query: Query, result: Any, request: FetchRequest) -> list[Query]:
        """After the fault candidates query: each filtered window over only the GPUs it named, the
        fault window also over those the last PCIe link check named (``link_check.py``)."""
        hints = request.hints
        if not query.candidates or hints is None:
            return []
        matchers, seconds = self.config.matchers, request.windows.get(Window.FAULT, 0.0)
        if query.checks_links:
            self.links.record(request.now, matchers, seconds, result.get(Window.FAULT, ()))
        elif seconds > 0:
            carried = self.links.carried(matchers, seconds)
            if carried:
                result = {**result, Window.FAULT: set(result.get(Window.FAULT, ())) | carried}
        return [
            query
            for w, keys in result.items()
            for query in restricted_queries(w, request.windows[w], hints, keys, self.config.matchers)
        ]

    def wait_refreshes(self, timeout: float | None = None) -> bool:
        """Wait for the background reads started so far (the tiered fetch's refreshes, the
        inventory's; tests and benchmarks): False if one is still running after ``timeout`` seconds
        (each waited for up to ``timeout``)."""
        refreshed = self.tiered.wait_refreshes(timeout)
        return self.inventory.wait(timeout) and refreshed
