"""Tiered refresh of the activity window: which GPUs to fetch fresh this cycle, which to carry.

At 8,000 GPUs Prometheus needs ~20 s to aggregate the activity window over every GPU, and its cost
grows with the GPUs covered. Most GPUs are busy and stay busy, and a busy verdict is harmless, so
with a refresh budget (``--prometheus-refresh-budget``) the source keeps each GPU's last activity
aggregates and fetches fresh, per cycle, only:

1. GPUs not in the cache, or whose node or pods changed since they were cached (whole window);
2. idle candidates: the cheap filter over every GPU (``promql.idle_candidates_query``) says their
   current peak is below the idle threshold on some activity-chain signal (the chain's signals
   only, the rest of their window reused: idleness reads nothing else);
3. GPUs whose cached aggregates are not clearly busy (``clearly_busy``), and GPUs without a newest
   sample time in the identity query (the chain's signals only, as 2);
3b. GPUs whose last whole window was fetched less than a window (plus two scrape intervals) after
   they were new, re-attributed, idle or not clearly busy (whole window; ``settling``): that window
   still holds samples from before the change, so their figures (a pod that woke up: from
   Underutilized to Efficient) and their sample count (a new pod: from too sparse to known) still
   move; carrying them would freeze the transition. Judged by when the window was fetched, not by
   the clock: a cycle slower than the window (a first cycle labelling thousands of pods) or an
   interval longer than it must not carry a window fetched right after the change as settled (it
   read Unknown until rule 4 came round: 16 cycles at 8,000 GPUs and a budget of 500);
4. and, after the cycle, about ``budget`` least recently refreshed cached GPUs, idle ones included,
   taken by buckets of UUID endings so that the query names them in a few bytes (whole window,
   evaluated at the cycle's time; ``oldest_cached``, ``ActivityCache.refreshed``): every GPU's
   diagnosis figures are about ``ceil(cached GPUs / budget)`` cycles old at most. No verdict
   of the cycle needs them, and fetching 500 GPUs' whole windows took Prometheus longer than the
   rest of the cycle's queries (1.1-1.9 s at 8,000 GPUs), so the source fetches them in the
   background once the cycle has its samples, and the next cycles carry them.

Safety (missing data never evicts; an idle verdict, hence an eviction, never comes from carried data): a
carried GPU has the same pods as when cached, and every activity-chain signal its cached window
holds has a peak at or above the threshold (or can never be usable: no samples, NaN). Whichever
chain signal the engine picks, the peak it reads is at or above the threshold: BUSY, or Unknown
when none is usable; never IDLE. The fresh filter makes the carried verdict also *right*: a GPU
that went idle on any chain signal is refreshed the same cycle. A carried window's freshness is
the GPU's newest sample time in the identity query (``GPUSample.carried_newest``, judged by
``engine.reclaim.activity.carried_bounds``), so a GPU whose exporter stopped still turns stale (Unknown);
its Stats are the entry's own, kept from cycle to cycle (``Entry.stats``). The cycle reads a
carried GPU's window from the very entry the plan judged (taken under the lock as it plans): a
background refresh replacing it later in the cycle is carried by the next cycles, once a plan has
judged it.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_efficiency.engine import ACTIVITY_CHAIN
from gpu_efficiency.engine.model import PodRef, Signal, Stats
from gpu_efficiency.sources.metrics.prometheus.aggregate_rows import AVG, COUNT, MAX, TS, WIDTH, rows_stats

#: (UUID, GPU_I_ID): how window values are keyed.
Key = tuple[str, str]
#: The chain's signals with their scale to a 0-1 fraction and largest valid value (engine/reclaim/activity.py).
_CHAIN = tuple((signal, scale, upper) for signal, upper, scale in ACTIVITY_CHAIN)
#: A cached peak counts as busy only this far (relative) above the threshold, like the fresh filter.
_MARGIN = 1e-6


@dataclass(frozen=True, slots=True)
class Seen:
    """What the identity query says of a GPU this cycle."""

    node: str
    pods: frozenset[PodRef]
    newest: float  # unix seconds of its newest sample; NaN when the query gave none


@dataclass(slots=True)
class Entry:
    """One GPU's cached activity window (compact: ~1.2 KB per GPU, not ~10 KB of Python floats)."""

    node: str
    pods: frozenset[PodRef]
    signals: tuple[Signal, ...]
    values: array  # type: ignore[type-arg]  # len(signals) * WIDTH doubles
    refreshed_at: float  # last whole-window refresh (rule 4's order)
    unsettled_at: float  # last cycle it was new, re-attributed, idle or not clearly busy
    built: dict[Signal, Stats] | None = None  # ``stats()``, once asked for

    def stats(self) -> dict[Signal, Stats]:
        """The window's Stats with the sample times they were fetched with, built once per entry:
        a carried GPU's window is the same objects cycle after cycle (~115,000 Stats at 8,000
        GPUs not rebuilt), and the engine judges their freshness by the GPU's newest sample time
        now (``GPUSample.carried_newest``). An entry is replaced, never changed, when refetched."""
        if self.built is None:
            self.built = rows_stats(self.rows(math.nan, exact=_ALL_SIGNALS))
        return self.built

    def rows(self, newest: float, exact: Collection[Signal] = ()) -> dict[Signal, list[float]]:
        """The cached rows, every present newest-sample time replaced by ``newest`` except those of
        ``exact`` signals (fetched this cycle: their own time decides their staleness)."""
        out = {}
        for i, signal in enumerate(self.signals):
            row = list(self.values[i * WIDTH : (i + 1) * WIDTH])
            if signal not in exact and math.isfinite(row[TS]):
                row[TS] = newest
            out[signal] = row
        return out

    def row(self, signal: Signal) -> Sequence[float] | None:
        if signal not in self.signals:
            return None
        i = self.signals.index(signal)
        return self.values[i * WIDTH : (i + 1) * WIDTH]


def clearly_busy(entry: Entry, idle_below: float) -> bool:
    """Can these aggregates only ever be judged busy (or Unknown), whatever their freshness?

    Every chain signal that could be usable (samples, finite in-range values) must peak at or above
    the threshold, and at least one must: then the engine's first usable signal, whichever it is,
    reads busy. A signal that can never be usable (no samples, NaN) is skipped by the engine too.
    """
    found = False
    for signal, scale, upper in _CHAIN:
        row = entry.row(signal)
        if row is None or row[COUNT] <= 0 or not math.isfinite(row[COUNT]):
            continue
        avg, peak = row[AVG], row[MAX]
        if not (0.0 <= avg <= upper and 0.0 <= peak <= upper):
            continue  # never usable: out of range or NaN
        if peak * scale < idle_below * (1.0 + _MARGIN):
            return False
        found = True
    return found


def settling(entry: Entry, settle_s: float) -> bool:
    """Rule 3b: does the entry's last whole window (fetched at ``refreshed_at``) still hold samples
    from before the GPU last changed (``unsettled_at``)? ``settle_s``: the window plus two scrape
    intervals. A GPU first seen with a window full of samples never changed (``-inf``)."""
    return entry.refreshed_at - entry.unsettled_at < settle_s


@dataclass(frozen=True, slots=True)
class RefreshPlan:
    """The cycle's split of the GPUs seen: ``full`` gets the whole activity window fresh, ``chain``
    only its activity-chain signals (the rest of its window reused), ``carried`` is reused whole."""

    full: frozenset[Key]
    chain: frozenset[Key] = frozenset()
    carried: frozenset[Key] = frozenset()
    new: int = 0  # rule 1: not cached, or node/pods changed
    idle: int = 0  # rule 2: named by the idle-candidates filter
    not_busy: int = 0  # rule 3: cached window not clearly busy, or no newest-sample time
    settling: int = 0  # rule 3b: unsettled within the last window, so its window still changes
    unsettled: frozenset[Key] = frozenset()  # rules 1-3 this cycle (``Entry.unsettled_at``)
    unrestricted: bool = False  # fetched over every GPU: the refresh set was too large to list
    chain_unlisted: bool = False  # the chains fetched over every GPU: too many to list
    too_long: bool = False  # unlisted because the list took too many queries (not because most GPUs)

    @property
    def refresh(self) -> frozenset[Key]:
        """Every GPU whose activity chain is fresh this cycle: the only ones that can be idle."""
        return self.full | self.chain


def plan_refresh(
    cache: Mapping[Key, Entry],
    seen: Mapping[Key, Seen],
    idle_candidates: Iterable[Key],
    idle_below: float,
    *,
    settle_s: float = 0.0,
) -> RefreshPlan:
    """Rules 1-3 (module docstring): new or re-attributed GPUs, and GPUs whose last whole window
    was fetched within ``settle_s`` after they changed (``settling``), in full; idle candidates and
    GPUs not clearly busy by their cache at least their activity chain; the rest carried (rule 4
    runs after the cycle).

    A listed UUID returns every MIG instance of it, so the instances of one UUID share the most
    thorough treatment any of them gets.
    """
    idle = set(idle_candidates)
    new, candidates, not_busy, settles = set(), set(), set(), set()
    for key, ident in seen.items():
        entry = cache.get(key)
        if entry is None or entry.node != ident.node or entry.pods != ident.pods:
            new.add(key)
        elif key in idle:
            candidates.add(key)
        elif not math.isfinite(ident.newest) or not clearly_busy(entry, idle_below):
            not_busy.add(key)
        elif settling(entry, settle_s):
            settles.add(key)
    full = _by_uuid(new | settles, seen)
    chain = _by_uuid(candidates | not_busy, seen) - full
    return RefreshPlan(
        full=full,
        chain=chain,
        carried=frozenset(seen) - full - chain,
        new=len(new),
        idle=len(candidates),
        not_busy=len(not_busy),
        settling=len(settles),
        unsettled=frozenset(new | candidates | not_busy),
    )


def early_chain(
    cache: Mapping[Key, Entry], idle_candidates: Iterable[Key], idle_below: float
) -> frozenset[str]:
    """The UUIDs whose activity chain rules 2 and 3 refresh as far as the idle filter and the cache
    tell, before the identity query answers: cached GPUs the filter names or whose cached window is
    not clearly busy. Their chain can be fetched then, beside identity rather than after it; the plan
    adds what identity changes (a new or re-attributed GPU is fetched whole, one without a newest
    sample time gets its chain) and what was fetched for a GPU it carries is not read."""
    idle = set(idle_candidates)
    return frozenset(
        key[0] for key, entry in cache.items() if key in idle or not clearly_busy(entry, idle_below)
    )


#: Longest UUID ending a refresh-budget bucket is named by (``ending_length``).
MAX_ENDING = 8


def ending_length(uuids: Collection[str], budget: int) -> int:
    """The shortest UUID ending (1 to ``MAX_ENDING`` characters) whose buckets hold ``budget``
    GPUs or fewer on average: one hex character splits a fleet in 16, two in 256."""
    for length in range(1, MAX_ENDING):
        if len(uuids) <= max(1, budget) * len({u[-length:] for u in uuids}):
            return length
    return MAX_ENDING


def oldest_cached(
    cache: Mapping[Key, Entry], budget: int, now: float, settle_s: float
) -> tuple[dict[Key, Entry], frozenset[str] | None]:
    """Rule 4, after a cycle at ``now`` has updated the cache: about ``budget`` of the entries not
    refreshed in full at ``now`` and not settling (those are refreshed in full each cycle anyway),
    least recently refreshed first, with every cached instance of their UUIDs (a listed UUID
    returns them all), and the UUID endings that select them (None: every GPU).

    Taken by buckets of UUIDs sharing an ending (``ending_length``), oldest bucket first, as many
    as the budget holds (one at least): the query selects them with a few bytes per bucket
    (``UUID=~".*(a|b)"``) where listing them cost ~3.1 KB per GPU, which no backend's query-size
    limit holds (VictoriaMetrics: 16 KiB). Every GPU is still brought round, a bucket at a time."""
    eligible = [
        (entry.refreshed_at, key)
        for key, entry in cache.items()
        if entry.refreshed_at < now and not settling(entry, settle_s)
    ]
    if budget <= 0 or not eligible:
        return {}, frozenset()
    length = ending_length({key[0] for key in cache}, budget)
    buckets: dict[str, list[tuple[float, Key]]] = {}
    for at, key in eligible:
        buckets.setdefault(key[0][-length:], []).append((at, key))
    taken: set[str] = set()
    count = 0  # UUIDs taken: a listed UUID brings every instance of it
    for ending, members in sorted(buckets.items(), key=lambda kv: (min(kv[1]), kv[0])):
        size = len({key[0] for _, key in members})
        if taken and count + size > budget:
            break
        taken.add(ending)
        count += size
    uuids = {key[0] for ending in taken for _, key in buckets[ending]}
    every = {key[0][-length:] for key in cache}
    return {key: entry for key, entry in cache.items() if key[0] in uuids}, (
        None if taken == every else frozenset(taken)
    )


def _by_uuid(keys: set[Key], seen: Iterable[Key]) -> frozenset[Key]:
    """``keys`` and every other instance of their UUIDs."""
    uuids = {uuid for uuid, _ in keys}
    return frozenset(k for k in seen if k[0] in uuids)


def everything(seen: Iterable[Key], plan: RefreshPlan | None = None) -> RefreshPlan:
    """A plan refreshing every GPU in full (the first cycle, or a refresh set too large to list),
    keeping ``plan``'s counts of why GPUs needed refreshing."""
    keys = frozenset(seen)
    base = plan or RefreshPlan(full=keys, new=len(keys))
    return replace(base, full=keys, chain=frozenset(), carried=frozenset(), unrestricted=True)


#: The signals a ``chain`` refresh fetches.
CHAIN_SIGNALS = tuple(signal for signal, _, _ in _CHAIN)
_ALL_SIGNALS = frozenset(Signal)


@dataclass
class ActivityCache:
    """Per-GPU activity windows of one (window length, matchers), between cycles."""

    entries: dict[Key, Entry] = field(default_factory=dict)
    refresh: threading.Thread | None = None  # rule 4's background fetch, the latest started
    _interned: dict[tuple[Signal, ...], tuple[Signal, ...]] = field(default_factory=dict)

    def _entry(
        self,
        node: str,
        pods: frozenset[PodRef],
        rows: Mapping[Signal, Sequence[float]],
        refreshed_at: float,
        unsettled_at: float,
    ) -> Entry:
        signals = tuple(sorted(rows, key=lambda s: s.value))
        signals = self._interned.setdefault(signals, signals)
        values = array("d", (v for s in signals for v in rows[s]))
        return Entry(node, pods, signals, values, refreshed_at, unsettled_at)

    def _unsettled_at(
        self, key: Key, plan: RefreshPlan, now: float, rows: Mapping[Signal, Sequence[float]], full: float
    ) -> float:
        """When the GPU last changed, for rule 3b. A GPU seen for the first time (a new pod, or any
        GPU after a restart) counts as changed unless its window is already full of samples."""
        old = self.entries.get(key)
        if old is None:
            counts = [rows[s][COUNT] for s in CHAIN_SIGNALS if s in rows]
            return -math.inf if counts and all(c >= full for c in counts) else now
        return now if key in plan.unsettled else old.unsettled_at

    def update(
        self,
        seen: Mapping[Key, Seen],
        plan: RefreshPlan,
        fresh: Mapping[Key, Mapping[Signal, Sequence[float]]],
        now: float,
        full_count: float = math.inf,
    ) -> None:
        """Store what was fetched: full windows as they are (none returned: an empty, never-busy
        entry), chain refreshes over the cached window's other signals (keeping its refresh time,
        so the budget still brings it round in full); forget GPUs no longer seen. ``full_count``:
        the sample count of a window full of samples (window / scrape interval, less one)."""
        for key in plan.full:
            rows = fresh.get(key, {})
            since = self._unsettled_at(key, plan, now, rows, full_count)
            self.entries[key] = self._entry(seen[key].node, seen[key].pods, rows, now, since)
        for key in plan.chain:
            old = self.entries[key]
            merged: dict[Signal, Sequence[float]] = {
                s: r for s, r in old.rows(math.nan, exact=_ALL_SIGNALS).items() if s not in CHAIN_SIGNALS
            }
            merged.update(fresh.get(key, {}))
            since = self._unsettled_at(key, plan, now, merged, full_count)
            self.entries[key] = self._entry(seen[key].node, seen[key].pods, merged, old.refreshed_at, since)
        for key in [k for k in self.entries if k not in seen]:
            del self.entries[key]

    def refreshed(
        self, taken: Mapping[Key, Entry], fresh: Mapping[Key, Mapping[Signal, Sequence[float]]], at: float
    ) -> int:
        """Store rule 4's whole windows, fetched at ``at`` for the entries ``taken`` from the cache
        (``oldest_cached``): each replaces its entry only if the cache still holds that very entry
        (a cycle since may have re-planned the GPU, or forgotten it). Returns how many it replaced."""
        stored = 0
        for key, entry in taken.items():
            if self.entries.get(key) is not entry:
                continue
            self.entries[key] = self._entry(
                entry.node, entry.pods, fresh.get(key, {}), at, entry.unsettled_at
            )
            stored += 1
        return stored

    def whole_stats(self, plan: RefreshPlan) -> WholeStats:
        """The Stats of the windows fetched whole this cycle (call after ``update``), each built
        from its new entry when read: the same values as its rows', and kept by the entry
        (``Entry.stats``), so the next cycles carry them without building them again (after the
        first cycle or a restart, ~8,000 at once: ~0.3 CPU-s of the first steady cycle). A GPU
        whose fetch returned nothing (an entry without signals) has no Stats, as before."""
        return WholeStats({key: entry for key in plan.full if (entry := self.entries[key]).signals})

    def reused_rows(self, plan: RefreshPlan, seen: Mapping[Key, Seen], carried: bool = True) -> ReusedRows:
        """Rows the cycle takes from the cache (call after ``update``): carried GPUs' whole windows
        (unless ``carried`` is False: the caller took them when it planned) and chain-refreshed
        GPUs' whole windows (their chain already fresh in the cache), with newest-sample times from
        the identity query; built one GPU at a time as they are read."""
        keys = (plan.carried | plan.chain) if carried else plan.chain
        return ReusedRows({key: self.entries[key] for key in keys}, seen, plan.chain)


class WholeStats:
    """``ActivityCache.whole_stats``: entries' Stats built as ``prometheus.windows.samples`` pops them, so a
    GPU's rows are freed as its Stats are made (never every GPU's of both at once)."""

    def __init__(self, entries: dict[Key, Entry]) -> None:
        self._entries = entries

    def pop(self, key: Key, default: None = None, /) -> dict[Signal, Stats] | None:
        entry = self._entries.pop(key, None)
        return default if entry is None else entry.stats()


class ReusedRows(Mapping[Key, dict[Signal, list[float]]]):
    """The cached windows a cycle reuses, as rows built when read (``pop`` forgets the GPU).

    Building every carried GPU's rows at once held ~8,000 GPUs x 8 signals of Python lists (tens of
    MB) next to the ``Stats`` made from them; built as ``prometheus.windows.samples`` consumes them, at
    most one GPU's rows live at a time. The entries are captured when made: ``update`` replaces
    entries rather than changing them, so a later cycle's update cannot change what this one reads.
    """

    def __init__(self, entries: dict[Key, Entry], seen: Mapping[Key, Seen], exact: Collection[Key]) -> None:
        self._entries = entries
        self._seen = seen
        self._exact = exact  # chain-refreshed GPUs: their chain's own sample times are kept

    def __getitem__(self, key: Key) -> dict[Signal, list[float]]:
        entry = self._entries[key]
        exact = CHAIN_SIGNALS if key in self._exact else ()
        return entry.rows(self._seen[key].newest, exact=exact)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def pop(
        self, key: Key, default: dict[Signal, list[float]] | None = None
    ) -> dict[Signal, list[float]] | None:
        if key not in self._entries:
            return default
        rows = self[key]
        del self._entries[key]
        return rows
