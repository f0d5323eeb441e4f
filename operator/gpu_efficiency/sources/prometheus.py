"""Prometheus source: per-GPU window aggregates from dcgm-exporter (or node-agent) series.

prometheus-api-client provides the connection (session, retries, auth, TLS); response bodies are
decoded with orjson because decoding dominates at thousands of GPUs (see bench/engine_bench.py).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson
import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.model import GPUSample, PodRef, Signal, Stats, Window
from gpu_efficiency.sources.activity_cache import (
    CHAIN_SIGNALS,
    ActivityCache,
    Entry,
    Key,
    RefreshPlan,
    ReusedRows,
    Seen,
    WholeStats,
    early_chain,
    everything,
    oldest_cached,
    plan_refresh,
    rows_stats,
)
from gpu_efficiency.sources.base import DropTally, FetchRequest, FetchResult, SourceUnavailable
from gpu_efficiency.sources.deadline import Deadline, deadline, requests_fileno
from gpu_efficiency.sources.labels import (
    INVALID_ID,
    NODE_CONFLICT,
    GPUKey,
    node_of,
    pod_of,
    raw_key_of,
    valid_key,
)
from gpu_efficiency.sources.promql import (
    AGG_LABEL,
    AGGREGATIONS,
    CANDIDATE_LABEL,
    FILTERED_WINDOWS,
    MAX_LISTED_GPUS,
    QUERY_PLAN,
    Query,
    candidates_query,
    cycle_queries,
    identity_query,
    idle_candidates_query,
    listed_window_query,
    restricted_query,
    window_query,
)

log = logging.getLogger(__name__)
NAN = math.nan
_T = TypeVar("_T")


@dataclass(frozen=True)
class PrometheusConfig:
    """Connection settings; secrets are read from files so they can rotate without a restart."""

    url: str
    token_file: str | None = None
    basic_auth_file: str | None = None  # one line "user:password"
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 10.0
    retries: int = 2
    matchers: str = ""  # extra label matchers for every selector, e.g. 'job="dcgm"'
    #: Most series one answer may hold; more raises SourceUnavailable (a flood of forged series
    #: makes the cycle blind, never half-read). 0: no cap.
    max_series: int = 0
    extra_headers: Mapping[str, str] = field(default_factory=dict)


FORM = "application/x-www-form-urlencoded"
#: What must be escaped in a form value: its separators, its escape characters, and '=' for parsers
#: that split on every '=' (Go splits on '&' and rejects ';'). Everything else travels as it is.
_FORM_ESCAPES = (("%", "%25"), ("&", "%26"), ("+", "%2B"), (";", "%3B"), ("=", "%3D"))


def form_value(text: str) -> str:
    """``text`` as an ``application/x-www-form-urlencoded`` value, escaping only what a form parser
    reads specially. ``urllib.parse.quote_plus`` escapes per character in Python: ~0.2 s of CPU
    per cycle for a budget chunk's 1.4 M-character query at 8,000 GPUs; ``str.replace`` runs in C."""
    for char, escaped in _FORM_ESCAPES:
        text = text.replace(char, escaped)
    return text


def decode_vector(body: bytes) -> list[tuple[dict[str, str], float]]:
    """Decode an instant-query response into (labels, value) pairs; raise on an error response."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SourceUnavailable(f"Prometheus returned invalid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error", "unknown error") if isinstance(doc, dict) else "not an object"
        raise SourceUnavailable(f"Prometheus query failed: {error}")
    data = doc.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        found = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise SourceUnavailable(f"Prometheus returned {found!r}, expected a vector")
    result = data.get("result", ())
    if not isinstance(result, list | tuple):
        raise SourceUnavailable(f"Prometheus returned a {type(result).__name__} result, expected a list")
    out: list[tuple[dict[str, str], float]] = []
    for item in result:
        labels = item.get("metric", {}) if isinstance(item, dict) else None
        if not isinstance(labels, dict) or not all(type(v) is str for v in labels.values()):
            raise SourceUnavailable(f"Prometheus returned a malformed series: {str(item)[:200]}")
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            value = NAN
        out.append((labels, value))
    return out


#: Window responses are decoded this many bytes of JSON at a time (see ``iter_vector``).
CHUNK_BYTES = 1 << 20
_VECTOR_HEAD = b'{"status":"success","data":{"resultType":"vector","result":['
_SERIES_BOUNDARY = b'},{"metric":'  # cannot occur inside a JSON string: its quote is not escaped
_VALUE_KEY = b'"value":['


def iter_vector(chunks: Iterable[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[Any]]:
    """The result items (``{"metric": ..., "value": [t, "v"]}``) of an instant-query response read
    from ``chunks`` (the HTTP stream), about a MB of JSON at a time.

    A window response at 8,000 GPUs is ~70 MB of JSON and ~500 MB as Python objects; cut at series
    boundaries, only one chunk's objects exist at a time, and the body is never held whole.
    Anything but a plain success vector is read whole and goes through ``decode_vector`` (same
    errors, same result).
    """
    stream = iter(chunks)
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) >= len(_VECTOR_HEAD) + 1:
            break
    if not buf.startswith(_VECTOR_HEAD):
        yield _whole(buf, stream)
        return
    start = len(_VECTOR_HEAD)
    for chunk in stream:
        buf += chunk
        if len(buf) - start < chunk_bytes:
            continue
        cut = buf.rfind(_SERIES_BOUNDARY, start)
        if cut > start:
            try:
                items = orjson.loads(b"[" + buf[start : cut + 1] + b"]")
            except orjson.JSONDecodeError as exc:  # the boundary's text nested inside a series
                raise SourceUnavailable(f"Prometheus returned a malformed vector: {exc}") from exc
            yield items
            del buf[: cut + 2]
            start = 0
    # The last series ends at the first "]}" after its "value":[ (a [time, "number"] pair); the
    # result array and the data object close right after it (warnings may follow).
    if buf[start : start + 1] == b"]":
        return
    value = buf.find(_VALUE_KEY, buf.rfind(_SERIES_BOUNDARY, start) + 1 if start < len(buf) else start)
    end = buf.find(b"]}", value) + 2 if value >= 0 else -1
    if value < 0 or end < 2 or buf[end : end + 2] != b"]}":
        raise SourceUnavailable("Prometheus returned a truncated or malformed vector")
    try:
        yield orjson.loads(b"[" + buf[start:end] + b"]")
    except orjson.JSONDecodeError as exc:
        raise SourceUnavailable(f"Prometheus returned invalid JSON: {exc}") from exc


def _whole(head: bytearray, rest: Iterator[bytes]) -> list[Any]:
    body = bytes(head) + b"".join(rest)
    return [{"metric": labels, "value": (0, value)} for labels, value in decode_vector(body)]


class PrometheusSource:
    """A SampleSource issuing a constant number of PromQL queries per cycle."""

    def __init__(self, config: PrometheusConfig, refresh_budget: int = 0) -> None:
        """``refresh_budget`` > 0 turns on the tiered refresh of the activity window (see
        ``sources/activity_cache.py``): new, changed and possibly idle GPUs plus that many least
        recently refreshed ones fetched fresh per cycle, the rest carried from earlier cycles.
        0: every GPU every cycle."""
        self.config = config
        self.refresh_budget = refresh_budget
        self._caches: dict[tuple[float, str], ActivityCache] = {}
        self._cache_lock = threading.Lock()
        session = requests.Session()
        retry = Retry(
            total=config.retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET", "POST"}),
        )
        session.mount(config.url, requests.adapters.HTTPAdapter(max_retries=retry, pool_maxsize=8))
        if config.ca_file:
            session.verify = config.ca_file
        elif config.insecure_skip_verify:
            session.verify = False
        self._client = PrometheusConnect(url=config.url.rstrip("/"), session=session, method="POST")
        self._session = session

    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.extra_headers)
        if self.config.token_file:
            token = Path(self.config.token_file).read_text().strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _auth(self) -> tuple[str, str] | None:
        if not self.config.basic_auth_file:
            return None
        user, _, password = Path(self.config.basic_auth_file).read_text().strip().partition(":")
        return (user, password)

    def _request(self, text: str, at: float | None, limit: Deadline) -> requests.Response:
        """POST one instant query, streamed, its socket held by ``limit``; SourceUnavailable on
        transport, auth or HTTP errors (PromQL errors are found when the body is decoded)."""
        body = "query=" + form_value(text) + ("" if at is None else f"&time={at:.3f}")
        try:
            response = self._session.post(
                f"{self._client.url}/api/v1/query",
                data=body.encode(),
                headers={**self._headers(), "Content-Type": FORM},
                auth=self._auth(),
                timeout=limit.remaining(),
                stream=True,
            )
        except (requests.RequestException, OSError) as exc:
            raise SourceUnavailable(f"Prometheus at {self.config.url} unreachable: {exc}") from exc
        limit.hold_fileno(requests_fileno(response))
        if response.status_code in (401, 403):
            response.close()
            raise SourceUnavailable(f"Prometheus refused the credentials (HTTP {response.status_code})")
        if response.status_code >= 500 or response.status_code == 404:
            text = response.text[:200]
            response.close()
            raise SourceUnavailable(f"Prometheus answered HTTP {response.status_code}: {text}")
        return response

    def _exchange(self, text: str, at: float | None, read: Callable[[requests.Response], _T]) -> _T:
        """Send one query and ``read`` its answer, all by the wall-clock deadline ``queryTimeout``
        (see ``sources/deadline.py``); SourceUnavailable when it passes or the transport fails."""
        with deadline(self.config.timeout) as limit:
            try:
                response = self._request(text, at, limit)
                try:
                    return read(response)
                finally:
                    response.close()
            except (requests.RequestException, OSError, SourceUnavailable) as exc:
                if limit.expired or time.monotonic() >= limit.end:
                    raise SourceUnavailable(
                        f"Prometheus at {self.config.url} did not answer within {limit.seconds:g}s ({exc})"
                    ) from exc
                if isinstance(exc, SourceUnavailable):
                    raise
                raise SourceUnavailable(
                    f"reading from Prometheus at {self.config.url} failed: {exc}"
                ) from exc

    def _body(self, text: str, at: float | None = None) -> bytes:
        return self._exchange(text, at, lambda response: response.content)

    def query(self, text: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Run one instant query; SourceUnavailable on any transport, auth or PromQL error, or
        when the answer holds more than ``max_series`` series."""
        series = decode_vector(self._body(text, at))
        _check_cap(len(series), self.config.max_series)
        return series

    def window_values(self, query: Query, at: float | None = None) -> WindowValues:
        """Run a window query, folding its series as they stream in (see ``iter_vector``);
        SourceUnavailable as soon as more than ``max_series`` series have come."""
        return self._exchange(
            query.text,
            at,
            lambda response: fold_window(iter_vector(response.iter_content(1 << 20)), self.config.max_series),
        )

    def _run(self, query: Query, at: float, drops: DropTally | None = None) -> Any:
        """What the fetch needs from one query: identities, candidates or a window's values.
        Series naming a malformed GPU identifier are dropped (and counted in ``drops``): listed in a
        later query's regex, one of them used to make Prometheus reject the whole fetch."""
        if query.window is not None:
            return self.window_values(query, at)
        series = self.query(query.text, at)
        drops = drops if drops is not None else DropTally()
        if query.idle:
            return _idle_keys(series, drops)
        return _candidates(series, drops) if query.candidates else _identities(series, drops)

    def check(self) -> bool:
        """Is Prometheus reachable and healthy? For startup logs and readiness."""
        return bool(self._client.check_prometheus_connection())

    def _first_round(self, request: FetchRequest) -> list[Query]:
        """Identity, the unfiltered windows and (with hints) the fault candidates query."""
        matchers, hints = self.config.matchers, request.hints
        if hints is None:
            return list(cycle_queries(request.windows, matchers))
        # filtered windows come second, for the GPUs the candidates query names
        queries = [
            q for q in cycle_queries(request.windows, matchers, hints) if q.window not in FILTERED_WINDOWS
        ]
        candidates = candidates_query(request.windows, hints, matchers)
        if candidates is not None:
            queries.append(candidates)
        return queries

    def fetch(self, request: FetchRequest) -> FetchResult:
        tiered = self.refresh_budget > 0 and request.windows.get(Window.ACTIVITY, 0.0) > 0
        if tiered and request.activity is not None:
            return self._fetch_tiered(request, request.activity.idle_below)
        started = time.monotonic()
        identity: dict[GPUKey, _Identity] = {}
        windows: dict[Window, WindowValues] = {}
        drops = DropTally()

        def take(query: Query, result: Any) -> list[Query]:
            nonlocal identity
            if query.window is not None:
                windows[query.window] = result
            elif not query.candidates:
                identity = result
            return self._fault_windows(query, result, request)

        with gc_paused():
            queries = self._first_round(request)
            sent = self._run_rounds(
                queries, request.now, take, len(queries) + len(FILTERED_WINDOWS), drops=drops
            )
            gpus = samples(identity, windows, request)
        return FetchResult(
            gpus=gpus, queries=sent, seconds=time.monotonic() - started, dropped=drops.counts()
        )

    def _run_rounds(
        self,
        queries: list[Query],
        at: float,
        take: Callable[[Query, Any], list[Query]],
        workers: int,
        meanwhile: Callable[[], None] | None = None,
        drops: DropTally | None = None,
    ) -> int:
        """Run ``queries`` concurrently; ``take`` gets each answer as it arrives and returns the
        queries it makes necessary (a later round), which run on the same pool; ``meanwhile`` is
        called whenever queries are still in flight after that. Returns how many were sent."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending = {pool.submit(self._run, q, at, drops): q for q in queries}
            sent = len(pending)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    for more in take(pending.pop(future), future.result()):
                        pending[pool.submit(self._run, more, at, drops)] = more
                        sent += 1
                if pending and meanwhile is not None:
                    meanwhile()
        return sent

    def _fault_windows(self, query: Query, result: Any, request: FetchRequest) -> list[Query]:
        """After the fault candidates query: each filtered window over only the GPUs it named."""
        hints = request.hints
        if not query.candidates or hints is None:
            return []
        return [
            restricted_query(w, request.windows[w], hints, uuids, self.config.matchers)
            for w, uuids in result.items()
        ]

    def _fetch_tiered(self, request: FetchRequest, idle_below: float) -> FetchResult:
        """``fetch`` with the activity window refreshed only where it matters (activity_cache.py):
        identity (with newest-sample times), idle candidates and fault candidates first; then the
        activity window of the refresh set, in chunks of listed UUIDs run concurrently (the chains
        the idle filter and the cache name as soon as the filter answers, beside identity). The refresh
        budget's whole windows for later cycles (rule 4) are the result's ``then``."""
        started = time.monotonic()
        matchers = self.config.matchers
        seconds = request.windows[Window.ACTIVITY]
        queries = [
            identity_query(matchers, timestamps=True),
            idle_candidates_query(seconds, idle_below, matchers),
        ]
        queries += [
            q for q in self._first_round(request) if q.candidates or q.window not in (None, Window.ACTIVITY)
        ]
        cache = self._cache(seconds)
        state = _TieredRound()
        drops = DropTally()
        settle_s = seconds + 2 * request.scrape_interval

        def take(query: Query, result: Any) -> list[Query]:
            state.take(query, result)
            more = self._fault_windows(query, result, request)
            if query.idle and state.identity is None:  # the chains the cache already names: now
                with self._cache_lock:
                    uuids = early_chain(cache.entries, result, idle_below)
                    cached = len({uuid for uuid, _ in cache.entries})
                chunks = listed_chunks(sorted(uuids), seconds, matchers, chain_only=True)
                if worth_listing(len(chunks), len(uuids), cached):
                    state.early, more = uuids, more + chunks
            if state.plan is None and state.identity is not None and state.idle is not None:
                with self._cache_lock:
                    plan = plan_refresh(
                        cache.entries, state.seen, state.idle, idle_below, now=request.now, settle_s=settle_s
                    )
                    # the entries the plan judged: a background refresh may replace them from now on
                    carried = {key: cache.entries[key] for key in plan.carried}
                state.plan, activity = activity_queries(plan, state.seen, seconds, matchers, state.early)
                state.carried = {key: carried[key] for key in state.plan.carried}
                more += activity
            return more

        with gc_paused():
            sent = self._run_rounds(
                queries, request.now, take, MAX_ACTIVITY_CHUNKS + 8, state.build_carried, drops
            )
            if state.identity is None or state.plan is None:
                raise SourceUnavailable("Prometheus answered no identity or idle-candidates query")
            plan = state.plan
            state.build_carried()
            with self._cache_lock:
                scrape = request.scrape_interval
                full_count = seconds / scrape - 1 if scrape > 0 else math.inf
                cache.update(state.seen, plan, state.fresh, request.now, full_count)
                reused = cache.reused_rows(plan, state.seen, carried=False)
                whole = cache.whole_stats(plan)
            windows: dict[Window, Rows] = {**state.windows, Window.ACTIVITY: _Overlay(reused, state.fresh)}
            gpus = samples(
                state.identity, windows, request, {Window.ACTIVITY: state.built}, {Window.ACTIVITY: whole}
            )
        log.debug(
            "activity window: %d in full%s, %d chain only (new %d, idle %d, not busy %d, settling %d),"
            " %d carried, %d queries",
            len(plan.full),
            " (unrestricted)" if plan.unrestricted else "",
            len(plan.chain),
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
            then=functools.partial(self._refresh_oldest, cache, request.now, settle_s, seconds),
            dropped=drops.counts(),
        )

    def _refresh_oldest(self, cache: ActivityCache, at: float, settle_s: float, seconds: float) -> int:
        """Rule 4 (activity_cache.py; the tiered fetch's ``FetchResult.then``): start fetching, in the
        background, the whole windows at ``at`` of the refresh budget's least recently refreshed
        GPUs. One refresh per cache at a time: one still running when the next cycle ends
        (Prometheus slower than the interval) makes that cycle start none. Returns how many GPUs it
        started refreshing."""
        with self._cache_lock:
            running = cache.refresh
            if running is not None and running.is_alive():
                return 0
            taken = oldest_cached(cache.entries, self.refresh_budget, at, settle_s)
            if not taken:
                return 0
            chunks = listed_chunks(sorted({uuid for uuid, _ in taken}), seconds, self.config.matchers)
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
                    for key, rows in self._run(query, at).items():
                        fresh.setdefault(key, {}).update(rows)
        except Exception as exc:  # a failed refresh changes nothing: the entries are just older
            log.warning("refreshing %d cached activity windows failed: %s", len(taken), exc)
            return
        with self._cache_lock:
            stored = cache.refreshed(taken, fresh, at)
        log.debug("refreshed %d of %d cached activity windows (%d queries)", stored, len(taken), len(chunks))

    def wait_refreshes(self, timeout: float | None = None) -> bool:
        """Wait for the background refreshes started so far (tests and benchmarks);
        False if one is still running after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cache_lock:
            running = [c.refresh for c in self._caches.values() if c.refresh is not None]
        for thread in running:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in running)

    def _cache(self, seconds: float) -> ActivityCache:
        """The activity cache of this window length (policies may differ); a few kept at most."""
        key = (seconds, self.config.matchers)
        with self._cache_lock:
            cache = self._caches.get(key)
            if cache is None:
                while len(self._caches) >= MAX_CACHED_WINDOWS:
                    del self._caches[next(iter(self._caches))]
                cache = self._caches[key] = ActivityCache()
            return cache


@dataclass
class _TieredRound:
    """What a tiered fetch has received so far; the refresh plan is made once identity and the idle
    candidates are both in."""

    identity: dict[GPUKey, _Identity] | None = None
    idle: set[Key] | None = None
    seen: dict[Key, Seen] = field(default_factory=dict)
    plan: RefreshPlan | None = None
    windows: dict[Window, WindowValues] = field(default_factory=dict)
    fresh: WindowValues = field(default_factory=dict)
    early: frozenset[str] = frozenset()  # UUIDs whose chain was asked for before identity answered
    carried: dict[Key, Entry] = field(default_factory=dict)  # the plan's carried GPUs, as it judged them
    built: dict[Key, dict[Signal, Stats]] = field(default_factory=dict)  # their Stats (build_carried)

    def build_carried(self) -> None:
        """The carried GPUs' activity Stats, from the entries the plan judged: each entry's own
        (``Entry.stats``, built once per entry and then kept), taken while the chains and the fault
        candidates are still in flight. ``samples`` marks them carried, with identity's newest time."""
        if not self.carried:
            return
        for key, entry in self.carried.items():
            self.built[key] = entry.stats()
        self.carried = {}

    def take(self, query: Query, result: Any) -> None:
        if query.window is Window.ACTIVITY:
            for key, rows in result.items():  # chunks list disjoint UUIDs; merged all the same
                self.fresh.setdefault(key, {}).update(rows)
        elif query.window is not None:
            self.windows[query.window] = result
        elif query.idle:
            self.idle = result
        elif not query.candidates:
            self.identity = result
            self.seen = {
                (k.uuid, k.instance_id): Seen(i.node, frozenset(i.pods), i.newest) for k, i in result.items()
            }


#: Beyond this many listed chunks (or half the GPUs) the activity window is fetched over every GPU:
#: listing costs Prometheus about twice as much per GPU as the unrestricted query (measured at 8,000).
MAX_ACTIVITY_CHUNKS = 8
#: Activity caches kept per source (one per distinct window length among the policies).
MAX_CACHED_WINDOWS = 4


#: Terms of the whole activity window and of its activity chain only (67 and 13 with today's plan).
_FULL_TERMS = sum(len(aggs) for aggs in QUERY_PLAN[Window.ACTIVITY].values())
_CHAIN_TERMS = sum(len(aggs) for sig, aggs in QUERY_PLAN[Window.ACTIVITY].items() if sig in CHAIN_SIGNALS)


def chunk_gpus(chain_only: bool) -> int:
    """GPUs listed per activity query: MAX_LISTED_GPUS whole windows, or as many chain-only
    windows as give the same number of series (~2,500: 13 terms of 67). A chunk's cost to
    Prometheus and to decode follows its series, so a thousand idle GPUs' chains are one query."""
    if not chain_only:
        return MAX_LISTED_GPUS
    return max(1, MAX_LISTED_GPUS * _FULL_TERMS // _CHAIN_TERMS)


def worth_listing(chunks: int, listed: int, total: int) -> bool:
    """Is fetching ``listed`` of ``total`` GPUs' activity in ``chunks`` listed queries cheaper than
    the unrestricted query? Not beyond MAX_ACTIVITY_CHUNKS queries or half the GPUs."""
    return chunks <= MAX_ACTIVITY_CHUNKS and 2 * listed <= total


def activity_queries(
    plan: RefreshPlan,
    seen: Mapping[Key, Seen],
    seconds: float,
    matchers: str,
    chains_sent: Collection[str] = frozenset(),
) -> tuple[RefreshPlan, list[Query]]:
    """The activity queries of a refresh plan: full windows and chain-only windows of its UUIDs
    (those of ``chains_sent`` already asked for: ``early_chain``), ``chunk_gpus`` listed per
    query; the full window over every GPU (and the plan widened to all) when the refresh set is
    most GPUs or would take too many queries."""
    full = sorted({uuid for uuid, _ in plan.full})
    chain = sorted({uuid for uuid, _ in plan.chain})
    chunks = math.ceil(len(full) / chunk_gpus(False)) + math.ceil(len(chain) / chunk_gpus(True))
    if not worth_listing(chunks, len(full) + len(chain), len({uuid for uuid, _ in seen})):
        return everything(seen, plan), [window_query(Window.ACTIVITY, seconds, matchers)]
    return plan, [
        *listed_chunks(full, seconds, matchers),
        *listed_chunks([u for u in chain if u not in chains_sent], seconds, matchers, chain_only=True),
    ]


def listed_chunks(
    uuids: Sequence[str], seconds: float, matchers: str, chain_only: bool = False
) -> list[Query]:
    """The activity window of these UUIDs (their chain only), ``chunk_gpus`` listed per query."""
    size = chunk_gpus(chain_only)
    return [
        listed_window_query(Window.ACTIVITY, seconds, uuids[i : i + size], matchers, chain_only)
        for i in range(0, len(uuids), size)
    ]


def _candidates(
    series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally
) -> dict[Window, set[str]]:
    """The candidates query's answer: per filtered window, the UUIDs of the GPUs to fetch."""
    windows = {w.value: w for w in FILTERED_WINDOWS}
    out: dict[Window, set[str]] = {}
    for labels, _ in series:
        window = windows.get(labels.get(CANDIDATE_LABEL, ""))
        uuid = labels.get("UUID")
        if window is None or not uuid:
            continue
        if not valid_key(uuid, labels.get("GPU_I_ID", "")):
            drops.add(INVALID_ID)
            continue
        out.setdefault(window, set()).add(uuid)
    return out


def _idle_keys(series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally) -> set[tuple[str, str]]:
    """The idle-candidates query's answer: the (UUID, GPU_I_ID) keys it names."""
    out: set[tuple[str, str]] = set()
    for labels, _ in series:
        key = (labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
        if valid_key(*key):
            out.add(key)
        else:
            drops.add(INVALID_ID)
    return out


@dataclass
class _Identity:
    node: str = ""
    index: str = ""
    model: str = ""
    pods: set[PodRef] = field(default_factory=set)
    newest: float = NAN  # largest series value: the newest sample time with identity_query(timestamps=True)


def _identities(
    series: Iterable[tuple[dict[str, str], float]], drops: DropTally | None = None
) -> dict[GPUKey, _Identity]:
    """One identity per GPU from the identity query's series (one per GPU and attributed pod).
    Malformed identifiers and GPUs claimed by two nodes are dropped and counted."""
    out: dict[GPUKey, _Identity] = {}
    conflicts: set[GPUKey] = set()
    drops = drops if drops is not None else DropTally()
    for labels, value in series:
        key = raw_key_of(labels)
        if key is None:
            continue
        if not valid_key(key.uuid, key.instance_id):
            drops.add(INVALID_ID)
            continue
        node = node_of(labels)
        ident = out.get(key)
        if ident is None:
            ident = out[key] = _Identity(
                node=node, index=labels.get("gpu", ""), model=labels.get("modelName", "")
            )
        elif node and node != ident.node:
            if ident.node:
                conflicts.add(key)
            else:
                ident.node = node
        pod = pod_of(labels)
        if pod is not None:
            ident.pods.add(pod)
        if math.isfinite(value) and not value <= ident.newest:  # max, NaN-safe
            ident.newest = value
    for key in conflicts:
        del out[key]
    drops.add(NODE_CONFLICT, len(conflicts))
    return out


def _stats(aggs: Mapping[str, float]) -> Stats:
    count = aggs.get("count", NAN)
    return Stats(
        avg=aggs.get("avg", NAN),
        max=aggs.get("max", NAN),
        min=aggs.get("min", NAN),
        last=aggs.get("last", NAN),
        count=int(count) if math.isfinite(count) else 0,
        last_timestamp=aggs.get("ts", NAN),
        stddev=aggs.get("stddev", NAN),
        changes=int(aggs["changes"]) if math.isfinite(aggs.get("changes", NAN)) else 0,
        resets=int(aggs["resets"]) if math.isfinite(aggs.get("resets", NAN)) else 0,
    )


#: One window's aggregates: (UUID, GPU_I_ID) -> signal -> values in ``_FIELDS`` order (NaN: not returned).
WindowValues = dict[tuple[str, str], dict[Signal, list[float]]]
_FIELDS = ("avg", "max", "min", "last", "count", "ts", "stddev", "changes", "resets")
_TAGS: dict[str, tuple[Signal, int]] = {
    f"{s.name}:{agg}": (s, _FIELDS.index(agg)) for s in Signal for agg in AGGREGATIONS
}


def _check_cap(series: int, cap: int) -> None:
    if cap > 0 and series > cap:
        raise SourceUnavailable(
            f"Prometheus answered more than {cap} series (--prometheus-max-series): forged or "
            "duplicated series? Nothing is judged from a partial answer"
        )


def fold_window(chunks: Iterable[Iterable[Mapping[str, Any]]], max_series: int = 0) -> WindowValues:
    """A window query's series (each tagged ``SIGNAL:agg`` for one GPU key) as ``WindowValues``;
    SourceUnavailable past ``max_series`` series (0: no cap)."""
    out: WindowValues = {}
    tags, fields = _TAGS, len(_FIELDS)
    last_key: tuple[str, str] | None = None
    per_gpu: dict[Signal, list[float]] = {}
    seen = 0
    try:
        for items in chunks:
            if not isinstance(items, list):
                items = list(items)
            seen += len(items)
            _check_cap(seen, max_series)
            for item in items:
                labels = item.get("metric") or {}
                uuid = labels.get("UUID")
                found = tags.get(labels.get(AGG_LABEL, ""))
                if not uuid or found is None:
                    continue
                key = (uuid, labels.get("GPU_I_ID", ""))
                if key != last_key:  # consecutive series often share a GPU: skip the lookup then
                    found_gpu = out.get(key)
                    if found_gpu is None:
                        if type(uuid) is not str or type(key[1]) is not str:
                            raise TypeError(f"GPU labels {key!r} are not strings")
                        found_gpu = out[key] = {}
                    per_gpu, last_key = found_gpu, key
                signal, index = found
                row = per_gpu.get(signal)
                if row is None:
                    row = per_gpu[signal] = [NAN] * fields
                try:
                    row[index] = float(item["value"][1])
                except (KeyError, IndexError, TypeError, ValueError):
                    row[index] = NAN
    except (AttributeError, TypeError) as exc:  # a series or its labels not an object, a label a list
        raise SourceUnavailable(f"Prometheus returned a malformed series: {exc}") from exc
    return out


class Rows(Protocol):
    """A window's rows by GPU key, consumed by ``samples`` (a ``WindowValues`` dict, or lazier)."""

    def pop(self, key: tuple[str, str], default: None, /) -> dict[Signal, list[float]] | None: ...


class _Overlay:
    """The cached windows a tiered cycle reuses, over the rows it fetched (chain-only rows of a
    chain-refreshed GPU are superseded by its whole cached window, which already holds them)."""

    def __init__(self, reused: ReusedRows, fresh: WindowValues) -> None:
        self.reused, self.fresh = reused, fresh

    def pop(self, key: tuple[str, str], default: None, /) -> dict[Signal, list[float]] | None:
        fetched = self.fresh.pop(key, default)
        rows = self.reused.pop(key, default)
        return rows if rows is not None else fetched


def samples(
    identity: Mapping[GPUKey, _Identity],
    windows: Mapping[Window, Rows],
    request: FetchRequest,
    built: Mapping[Window, dict[Key, dict[Signal, Stats]]] | None = None,
    whole: Mapping[Window, WholeStats] | None = None,
) -> tuple[GPUSample, ...]:
    """Join identities with the window aggregates (consumed): one GPUSample per GPU, sorted.
    ``built``: carried windows' Stats (``Entry.stats``), taken instead of rows (also consumed);
    their GPU's sample is marked carried, with identity's newest time (``GPUSample.carried_newest``).
    ``whole``: Stats of windows fetched whole this cycle, equal to their rows' (also consumed), not
    marked carried."""
    expected = {
        w: s / request.scrape_interval for w, s in request.windows.items() if request.scrape_interval > 0
    }
    built = built or {}
    whole = whole or {}
    gpus = []
    for gpu_key, ident in identity.items():
        key = (gpu_key.uuid, gpu_key.instance_id)
        stats: dict[Window, dict[Signal, Stats]] = {}
        carried: float | None = None
        for window, values in windows.items():
            rows = values.pop(key, None)  # freed as it goes: rows and Stats are not both held
            ready = built[window].pop(key, None) if window in built else None
            own = whole[window].pop(key, None) if window in whole else None
            if ready is not None:
                stats[window], carried = ready, ident.newest
            elif own is not None:
                stats[window] = own
            elif rows is not None:
                stats[window] = rows_stats(rows)
        gpus.append(
            GPUSample(
                node=ident.node,
                uuid=gpu_key.id,
                index=ident.index,
                model=ident.model,
                pods=tuple(sorted(ident.pods, key=lambda p: (p.namespace, p.name, p.container))),
                stats=stats,
                source="prometheus",
                expected_samples=expected,
                fb_total_mib=_fb_total(stats.get(Window.ACTIVITY, {})),
                carried_newest=carried,
            )
        )
    gpus.sort(key=lambda g: (g.node, g.index, g.uuid))
    return tuple(gpus)


def _window_stats(tags: Mapping[str, float]) -> dict[Signal, Stats]:
    by_signal: dict[str, dict[str, float]] = {}
    for tag, value in tags.items():
        name, _, agg = tag.partition(":")
        by_signal.setdefault(name, {})[agg] = value
    return {_SIGNALS[name]: _stats(aggs) for name, aggs in by_signal.items() if name in _SIGNALS}


_SIGNALS = {s.name: s for s in Signal}


def _fb_total(activity: Mapping[Signal, Stats]) -> float | None:
    used, free = activity.get(Signal.FB_USED), activity.get(Signal.FB_FREE)
    if used is None or free is None:
        return None
    total = used.last + free.last
    return total if math.isfinite(total) and total > 0 else None
