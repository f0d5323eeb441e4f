"""Tiered activity refresh, the pure part: which GPUs are refreshed, and that carried data never
yields an idle verdict (Hypothesis)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_efficiency.engine.model import PodRef, Signal, Window
from gpu_efficiency.engine.reclaim.activity import ACTIVITY_CHAIN, DataBounds, gpu_activity
from gpu_efficiency.sources.metrics.base import FetchRequest
from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.promql import idle_limit
from gpu_efficiency.sources.metrics.prometheus.tiered.activity_cache import (
    CHAIN_SIGNALS,
    ActivityCache,
    Key,
    Seen,
    clearly_busy,
    early_chain,
    ending_length,
    oldest_cached,
    plan_refresh,
)
from gpu_efficiency.sources.metrics.prometheus.windows import samples

NOW = 1_700_000_000.0
POD = frozenset({PodRef("ns", "p")})
IDLE = 0.01


def row(peak: float, avg: float | None = None, count: float = 40, ts: float = NOW - 5) -> list[float]:
    """A row in ``aggregate_rows.FIELDS`` order: avg, max, min, last, count, ts, stddev, changes, resets."""
    avg = peak if avg is None else avg
    return [avg, peak, 0.0, peak, count, ts, 0.0, 0.0, 0.0]


def cached(
    rows: dict[Signal, list[float]], *, at: float = 0.0, pods: frozenset[PodRef] = POD
) -> ActivityCache:
    cache = ActivityCache()
    seen = {("GPU-1", ""): Seen("n1", pods, NOW)}
    cache.update(seen, plan_refresh({}, seen, (), IDLE), {("GPU-1", ""): rows}, at)
    return cache


def test_new_gpus_are_fetched_in_full() -> None:
    seen = {("GPU-1", ""): Seen("n1", POD, NOW), ("GPU-2", "1"): Seen("n1", frozenset(), NOW)}
    plan = plan_refresh({}, seen, (), IDLE)
    assert plan.full == frozenset(seen)
    assert plan.carried == frozenset()
    assert plan.new == 2


def test_busy_gpu_is_carried() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5)})
    seen = {("GPU-1", ""): Seen("n1", POD, NOW)}
    assert plan_refresh(cache.entries, seen, (), IDLE).carried == frozenset(seen)


def test_identity_change_refreshes() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5)})
    for changed in (Seen("n2", POD, NOW), Seen("n1", frozenset({PodRef("ns", "other")}), NOW)):
        plan = plan_refresh(cache.entries, {("GPU-1", ""): changed}, (), IDLE)
        assert plan.full == {("GPU-1", "")}
        assert plan.new == 1


def test_idle_candidates_refresh_their_chain() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5)})
    seen = {("GPU-1", ""): Seen("n1", POD, NOW)}
    plan = plan_refresh(cache.entries, seen, {("GPU-1", "")}, IDLE)
    assert plan.chain == frozenset(seen)
    assert plan.idle == 1


def test_cached_idle_or_unknown_always_refreshes() -> None:
    seen = {("GPU-1", ""): Seen("n1", POD, NOW)}
    for rows in (
        {Signal.SM_ACTIVE: row(0.001)},  # idle
        {Signal.SM_ACTIVE: row(0.5), Signal.GR_ENGINE_ACTIVE: row(0.0)},  # a later chain signal idle
        {Signal.GPU_UTIL: row(0.5)},  # 0.5 % of GPU_UTIL is 0.005: idle
        {Signal.FB_USED: row(1000.0)},  # no chain signal: Unknown
        {},  # nothing returned
    ):
        plan = plan_refresh(cached(rows).entries, seen, (), IDLE)
        assert plan.chain == frozenset(seen), rows
        assert plan.not_busy == 1


def test_never_usable_signals_do_not_block_carrying() -> None:
    rows = {
        Signal.SM_ACTIVE: row(math.nan),
        Signal.GR_ENGINE_ACTIVE: row(0.0, count=0),
        Signal.GPU_UTIL: row(50.0),
    }
    assert clearly_busy(cached(rows).entries[("GPU-1", "")], IDLE)


def test_no_identity_timestamp_is_not_carried() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5)})
    seen = {("GPU-1", ""): Seen("n1", POD, math.nan)}
    plan = plan_refresh(cache.entries, seen, (), IDLE)
    assert plan.carried == frozenset()
    assert plan.chain == frozenset(seen)


def test_budget_takes_least_recently_refreshed_first() -> None:
    cache = ActivityCache()
    keys = [(f"GPU-{i}", "") for i in range(6)]
    seen = {k: Seen("n1", POD, NOW) for k in keys}
    for i, key in enumerate(keys):  # GPU-i refreshed at time 10 - i: GPU-5 is the oldest
        plan = plan_refresh(cache.entries, {key: seen[key]}, (), IDLE)
        cache.update(
            {**{k: seen[k] for k in keys[: i + 1]}, key: seen[key]},
            plan,
            {key: {Signal.SM_ACTIVE: row(0.5)}},
            10 - i,
        )
    taken, _ = oldest_cached(cache.entries, 2, 20, settle_s=0)
    assert set(taken) == {keys[5], keys[4]}
    assert cache.refreshed(taken, {k: {Signal.SM_ACTIVE: row(0.6)} for k in taken}, 20) == 2
    assert cache.entries[keys[5]].refreshed_at == 20
    assert set(oldest_cached(cache.entries, 2, 30, settle_s=0)[0]) == {keys[3], keys[2]}
    # the next cycles carry what rule 4 fetched
    plan = plan_refresh(cache.entries, seen, (), IDLE)
    assert plan.carried == frozenset(seen)
    rows = cache.reused_rows(plan, seen)[keys[5]]
    assert rows[Signal.SM_ACTIVE][1] == 0.6


def test_mig_instances_of_a_uuid_share_the_refresh() -> None:
    cache = ActivityCache()
    a, b = ("GPU-1", "1"), ("GPU-1", "2")
    seen = {a: Seen("n1", POD, NOW), b: Seen("n1", frozenset(), NOW)}
    cache.update(seen, plan_refresh({}, seen, (), IDLE), {k: {Signal.SM_ACTIVE: row(0.5)} for k in seen}, 0)
    plan = plan_refresh(cache.entries, seen, {a}, IDLE)
    assert plan.chain == {a, b}


def test_chain_refresh_keeps_other_signals_and_refresh_time() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5), Signal.FB_USED: row(100.0, ts=NOW - 60)}, at=3.0)
    seen = {("GPU-1", ""): Seen("n1", POD, NOW - 1)}
    plan = plan_refresh(cache.entries, seen, {("GPU-1", "")}, IDLE)
    cache.update(seen, plan, {("GPU-1", ""): {Signal.SM_ACTIVE: row(0.0, ts=NOW - 20)}}, 9.0)
    entry = cache.entries[("GPU-1", "")]
    assert entry.refreshed_at == 3.0  # still due for a full refresh by the budget
    rows = cache.reused_rows(plan, seen)[("GPU-1", "")]
    assert rows[Signal.SM_ACTIVE][5] == NOW - 20  # fresh: its own newest time
    assert rows[Signal.FB_USED][5] == NOW - 1  # reused: the identity's newest time
    assert rows[Signal.FB_USED][1] == 100.0


def test_reused_rows_are_built_when_read_pop_forgets_and_a_later_update_cannot_change_them() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5, ts=NOW - 60)})
    key = ("GPU-1", "")
    seen = {key: Seen("n1", POD, NOW - 2)}
    plan = plan_refresh(cache.entries, seen, (), IDLE)
    assert plan.carried == {key}
    reused = cache.reused_rows(plan, seen)
    assert list(reused) == [key]
    assert len(reused) == 1
    # Rule 4 refreshes the GPU (idle now) before this cycle has read it: this cycle's view holds.
    taken, _ = oldest_cached(cache.entries, 5, 9.0, settle_s=0)
    assert cache.refreshed(taken, {key: {Signal.SM_ACTIVE: row(0.0)}}, 9.0) == 1
    assert (cache.entries[key].row(Signal.SM_ACTIVE) or [])[1] == 0.0
    assert reused[key][Signal.SM_ACTIVE][1] == 0.5
    rows = reused.pop(key, None)
    assert rows is not None
    assert rows[Signal.SM_ACTIVE][5] == NOW - 2
    assert reused.pop(key, None) is None
    assert len(reused) == 0
    assert reused.pop(("GPU-9", ""), None) is None


def test_carried_rows_take_identity_timestamps_and_gone_gpus_are_forgotten() -> None:
    cache = cached({Signal.SM_ACTIVE: row(0.5, ts=NOW - 600), Signal.MEMORY_TEMP: row(50.0, ts=math.nan)})
    seen = {("GPU-1", ""): Seen("n1", POD, NOW - 2)}
    plan = plan_refresh(cache.entries, seen, (), IDLE)
    rows = cache.reused_rows(plan, seen)[("GPU-1", "")]
    assert rows[Signal.SM_ACTIVE][5] == NOW - 2
    assert math.isnan(rows[Signal.MEMORY_TEMP][5])  # no time fetched: none invented
    cache.update({}, plan_refresh(cache.entries, {}, (), IDLE), {}, 5.0)
    assert cache.entries == {}


# --- The safety property ------------------------------------------------------------------------

_VALUES = st.one_of(
    st.sampled_from([0.0, 0.005, 0.0099999, 0.01, 0.010001, 0.5, 0.99, 1.0, 1.5, -0.1, math.nan, math.inf]),
    st.floats(0, 1),
)
_SCALE = {signal: scale for signal, _, scale in ACTIVITY_CHAIN}


@st.composite
def _rows(draw: st.DrawFn) -> dict[Signal, list[float]]:
    out = {}
    for signal in (*CHAIN_SIGNALS, Signal.FB_USED):
        if draw(st.booleans()):
            scale = _SCALE.get(signal, 0.01)
            peak, avg = draw(_VALUES) / scale, draw(_VALUES) / scale
            count = draw(st.sampled_from([0, 1, 5, 8, 40, math.nan]))
            ts = draw(st.sampled_from([NOW - 1, NOW - 100, NOW - 1000, math.nan]))
            out[signal] = row(peak, avg, count, ts)
    return out


def _sample_rows(key: Key, rows: dict[Signal, list[float]], newest: float) -> tuple[GPUKey, Identity]:
    return GPUKey(*key), Identity(node="n1", pods={PodRef("ns", key[0])}, newest=newest)


def _idle(rows: dict[Signal, list[float]], key: Key, threshold: float, bounds: DataBounds) -> bool:
    gpu = samples(
        dict([_sample_rows(key, rows, NOW)]),
        {Window.ACTIVITY: {key: {s: list(r) for s, r in rows.items()}}},
        FetchRequest(now=NOW, windows={Window.ACTIVITY: 120.0}, scrape_interval=15.0),
    )[0]
    activity = gpu_activity(gpu, bounds)
    return activity.known and activity.peak < threshold


def _filter(rows: dict[Signal, list[float]], threshold: float) -> bool:
    """What ``idle_candidates_query`` selects: a chain signal whose peak is below the limit."""
    return any(s in rows and rows[s][1] < idle_limit(threshold, _SCALE[s]) for s in CHAIN_SIGNALS)


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.lists(
        st.tuples(_rows(), _rows(), st.booleans(), st.sampled_from([NOW - 1, NOW - 500, math.nan])),
        max_size=8,
    ),
    threshold=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
    budget=st.integers(0, 4),
    needed=st.sampled_from([0, 4.8, 8]),
    oldest=st.sampled_from([NOW - 120, NOW - 10_000]),
)
def test_carried_gpus_are_never_idle_and_every_idle_gpu_is_refreshed(
    gpus: list[tuple[dict[Signal, list[float]], dict[Signal, list[float]], bool, float]],
    threshold: float,
    budget: int,
    needed: float,
    oldest: float,
) -> None:
    """For random caches (some of them refreshed by rule 4 after the cycle that cached them, with
    other GPUs' windows) and fresh windows: the engine never finds a carried GPU idle on the merged
    windows, every GPU it would find idle on fresh windows is refreshed, and refreshed GPUs get the
    verdict fresh windows give."""
    bounds = DataBounds(needed=needed, oldest=oldest)
    cache = ActivityCache()
    keys = [(f"GPU-{i}", "") for i in range(len(gpus))]
    old_seen = {k: Seen("n1", frozenset({PodRef("ns", k[0])}), NOW) for k in keys}
    cache.update(
        old_seen,
        plan_refresh({}, old_seen, (), threshold),
        {k: g[0] for k, g in zip(keys, gpus, strict=True)},
        0,
    )
    taken, _ = oldest_cached(cache.entries, budget, 0.5, settle_s=0.0)
    cache.refreshed(taken, {k: gpus[(i + 1) % len(gpus)][1] for i, k in enumerate(keys)}, 0.5)
    seen = {
        k: Seen("n1" if same else "n2", old_seen[k].pods, newest)
        for k, (_, _, same, newest) in zip(keys, gpus, strict=True)
    }
    fresh = {k: g[1] for k, g in zip(keys, gpus, strict=True)}
    candidates = {k for k in keys if _filter(fresh[k], threshold)}
    plan = plan_refresh(cache.entries, seen, candidates, threshold)
    assert plan.full | plan.chain | plan.carried == frozenset(keys)
    fetched = {
        k: {s: r for s, r in fresh[k].items() if k in plan.full or s in CHAIN_SIGNALS} for k in plan.refresh
    }
    cache.update(seen, plan, fetched, 1)
    merged = {**fetched, **cache.reused_rows(plan, seen)}
    for key in keys:
        fresh_idle = _idle(fresh[key], key, threshold, bounds)
        merged_idle = _idle(merged[key], key, threshold, bounds)
        if key in plan.carried:
            assert not merged_idle
        else:
            assert merged_idle == fresh_idle
        if fresh_idle:
            assert key in plan.refresh


def test_gpus_settle_for_a_window_after_a_change() -> None:
    """A GPU that woke up (or is new) is refreshed whole until its window holds only samples from
    after the change; then it is carried."""
    key, seen = ("GPU-1", ""), {("GPU-1", ""): Seen("n1", POD, NOW)}
    cache = ActivityCache()

    def cycle(at: float, rows: dict[Signal, list[float]], idle: set[Key]) -> Any:
        plan = plan_refresh(cache.entries, seen, idle, IDLE, settle_s=150.0)
        cache.update(seen, plan, {key: rows}, at)
        return plan

    assert cycle(0.0, {Signal.SM_ACTIVE: row(0.0)}, {key}).new == 1
    assert cycle(30.0, {Signal.SM_ACTIVE: row(0.0)}, {key}).chain == {key}  # idle: chain only
    woke = cycle(60.0, {Signal.SM_ACTIVE: row(0.9, avg=0.2)}, set())  # cached idle: rule 3
    assert (woke.chain, woke.not_busy) == ({key}, 1)
    settling = cycle(90.0, {Signal.SM_ACTIVE: row(0.9, avg=0.5)}, set())
    assert (settling.full, settling.settling) == ({key}, 1)
    assert cycle(210.0, {Signal.SM_ACTIVE: row(0.9)}, set()).full == {key}  # 150 s after 60: still
    assert cycle(240.0, {Signal.SM_ACTIVE: row(0.9)}, set()).carried == {key}


def test_first_sight_with_a_full_window_is_settled() -> None:
    """After a restart every GPU is new to the cache; one whose window is already full of samples
    is carried at once, one with a short window (a new pod) settles first."""
    seen = {("GPU-1", ""): Seen("n1", POD, NOW), ("GPU-2", ""): Seen("n1", POD, NOW)}
    cache = ActivityCache()
    plan = plan_refresh(cache.entries, seen, (), IDLE, settle_s=150.0)
    rows = {
        ("GPU-1", ""): {Signal.SM_ACTIVE: row(0.9, count=8)},
        ("GPU-2", ""): {Signal.SM_ACTIVE: row(0.9, count=3)},
    }
    cache.update(seen, plan, rows, 0.0, full_count=7)
    plan = plan_refresh(cache.entries, seen, (), IDLE, settle_s=150.0)
    assert (plan.carried, plan.full) == ({("GPU-1", "")}, {("GPU-2", "")})


def test_a_slow_cycle_does_not_settle_a_window_fetched_right_after_the_change() -> None:
    """Settling is judged by when the GPU's last whole window was fetched, not by the clock: a new
    pod's short window, fetched at 0, is fetched whole again by the next cycle however late it comes
    (a first cycle that labelled thousands of pods took 166 s; an interval of 5 min against a 2 min
    window), and only a window fetched 150 s or more after the change is carried."""
    key, seen = ("GPU-1", ""), {("GPU-1", ""): Seen("n1", POD, NOW)}
    cache = ActivityCache()

    def cycle(at: float, count: float) -> Any:
        plan = plan_refresh(cache.entries, seen, (), IDLE, settle_s=150.0)
        cache.update(seen, plan, {key: {Signal.SM_ACTIVE: row(0.9, count=count)}}, at, full_count=7)
        return plan

    assert cycle(0.0, 2).new == 1  # a new pod: 2 samples of a window that holds 7
    late = cycle(400.0, 8)  # the next cycle, 400 s later: the cached window still reads 2 samples
    assert (late.full, late.settling) == ({key}, 1)
    assert cycle(430.0, 8).carried == {key}  # fetched 400 s after the change: settled
    assert set(oldest_cached(cache.entries, 5, 460.0, settle_s=150.0)[0]) == {key}  # rule 4 takes it

    cache = ActivityCache()
    assert cycle(0.0, 2).new == 1
    assert cycle(100.0, 8).full == {key}  # fetched 100 s after the change: still settling
    assert oldest_cached(cache.entries, 5, 130.0, settle_s=150.0)[0] == {}  # rule 3b's, not rule 4's
    assert cycle(200.0, 8).full == {key}
    assert cycle(230.0, 8).carried == {key}


def _entries(*specs: tuple[Key, float, float]) -> dict[Key, Any]:
    """Cache entries of busy GPUs: (key, refreshed_at, unsettled_at)."""
    entries = {}
    for key, refreshed, unsettled in specs:
        cache, seen = ActivityCache(), {key: Seen("n1", POD, NOW)}
        cache.update(seen, plan_refresh({}, seen, (), IDLE), {key: {Signal.SM_ACTIVE: row(0.5)}}, refreshed)
        entries[key] = cache.entries[key]
        entries[key].unsettled_at = unsettled
    return entries


def test_oldest_cached_is_rule_4_after_the_cycle() -> None:
    entries = _entries(
        (("GPU-1", ""), NOW - 300, -math.inf),
        (("GPU-2", "1"), NOW - 200, -math.inf),
        (("GPU-2", "2"), NOW - 10, -math.inf),  # another instance of an oldest UUID: fetched with it
        (("GPU-3", ""), NOW - 900, NOW - 30),  # settling: refreshed in full by rule 3b anyway
        (("GPU-4", ""), NOW - 100, -math.inf),
        (("GPU-5", ""), NOW, -math.inf),  # refreshed in full by this very cycle
    )
    taken, endings = oldest_cached(entries, 2, NOW, settle_s=150)
    assert taken == {k: entries[k] for k in (("GPU-1", ""), ("GPU-2", "1"), ("GPU-2", "2"))}
    assert endings == {"1", "2"}  # what the query selects them by: UUID=~".*(1|2)"
    taken, endings = oldest_cached(entries, 10, NOW, settle_s=150)
    assert set(taken) == set(entries) - {("GPU-3", ""), ("GPU-5", "")}
    assert endings == {"1", "2", "4"}
    assert oldest_cached(entries, 0, NOW, 150)[0] == {}
    assert oldest_cached({}, 5, NOW, 150)[0] == {}


def test_the_budget_takes_buckets_of_uuid_endings_oldest_first() -> None:
    """Rule 4 by UUID endings: a bucket is one hex character (a 16th of the fleet) when the budget
    holds one, longer endings for smaller budgets; every GPU comes round, a bucket at a time."""
    hexes = [f"GPU-{i:08x}-{i * 7919 % 65536:04x}" for i in range(4096)]
    assert ending_length(hexes, 256) == 1
    assert ending_length(hexes, 100) == 2
    assert ending_length(hexes, 1) == 3
    entries = _entries(*(((f"GPU-{i:02x}", ""), NOW - 100, -math.inf) for i in range(64)))
    entries[("GPU-3a", "")].refreshed_at = NOW - 900  # the oldest: its bucket goes first
    taken, endings = oldest_cached(entries, 4, NOW, settle_s=0)
    assert endings == {"a"}  # 64 GPUs, 16 endings: 4 a bucket
    assert set(taken) == {(f"GPU-{i}a", "") for i in "0123"}
    taken, endings = oldest_cached(entries, 9, NOW, settle_s=0)
    assert endings == {"a", "0"}  # then by ending: two buckets of 4 in a budget of 9
    assert len(taken) == 8
    assert oldest_cached(entries, 64, NOW, settle_s=0)[1] is None  # every bucket: every GPU


def test_rule_4_replaces_only_the_entries_the_cache_still_holds() -> None:
    cache = ActivityCache()
    keys = [(f"GPU-{i}", "") for i in range(1, 5)]
    seen = {k: Seen("n1", POD, NOW) for k in keys}
    cache.update(seen, plan_refresh({}, seen, (), IDLE), {k: {Signal.SM_ACTIVE: row(0.5)} for k in keys}, 0)
    taken, _ = oldest_cached(cache.entries, 4, 10, settle_s=0)
    assert set(taken) == set(keys)
    # Before the background answer arrives, a cycle re-plans GPU-1 (its pod changed) and GPU-2 is gone.
    later = {**{k: seen[k] for k in keys[2:]}, keys[0]: Seen("n1", frozenset({PodRef("ns", "new")}), NOW)}
    plan = plan_refresh(cache.entries, later, (), IDLE)
    cache.update(later, plan, {keys[0]: {Signal.SM_ACTIVE: row(0.7)}}, 20)
    stored = cache.refreshed(taken, {k: {Signal.SM_ACTIVE: row(0.9)} for k in keys[:3]}, 10)
    assert stored == 2  # GPU-3 (answered) and GPU-4 (not answered: an empty, never-busy entry)
    assert (cache.entries[keys[0]].row(Signal.SM_ACTIVE) or [])[1] == 0.7  # the later cycle's kept
    assert cache.entries[keys[0]].pods == frozenset({PodRef("ns", "new")})
    assert keys[1] not in cache.entries
    assert (cache.entries[keys[2]].row(Signal.SM_ACTIVE) or [])[1] == 0.9
    assert cache.entries[keys[2]].refreshed_at == 10
    assert cache.entries[keys[2]].unsettled_at == taken[keys[2]].unsettled_at
    assert cache.entries[keys[3]].signals == ()
    # GPU-4's empty window is not clearly busy: the next cycle refreshes its chain
    assert plan_refresh(cache.entries, later, (), IDLE).chain == {keys[3]}


def test_early_chain_is_what_the_filter_and_the_cache_name() -> None:
    entries = _entries(*(((f"GPU-{i}", ""), 0.0, -math.inf) for i in range(4)))  # all busy by cache
    entries.update(cached({Signal.SM_ACTIVE: row(0.0)}).entries)  # GPU-1: cached idle
    entries[("GPU-4", "1")] = cached({}).entries[("GPU-1", "")]  # an empty window: never busy
    named = {("GPU-2", ""), ("GPU-9", "")}  # GPU-9 is not cached: new, fetched whole after identity
    assert early_chain(entries, named, IDLE) == {"GPU-1", "GPU-2", "GPU-4"}
    assert early_chain(entries, (), IDLE) == {"GPU-1", "GPU-4"}
