"""Window answers folded into aggregate rows, and rows joined with identities into GPUSamples.

A window query's series are tagged ``SIGNAL:agg`` per GPU key; ``fold_window`` turns them into one
row per signal (``sources/metrics/prometheus/aggregate_rows.py``) as they stream in, and ``samples`` joins them with
the identity query's answer, freeing each GPU's rows as its Stats are built.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gpu_efficiency.api.exporter_fields import FIELDS_BY_SIGNAL, Generation
from gpu_efficiency.engine import DropReason
from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.sources.metrics.base import DropTally, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus.aggregate_rows import FIELDS, WIDTH, rows_stats
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.exporter_inventory import ExporterView
from gpu_efficiency.sources.metrics.prometheus.promql import AGG_LABEL, AGGREGATIONS, TARGET_LABEL
from gpu_efficiency.sources.metrics.prometheus.tiered.activity_cache import Key, ReusedRows, WholeStats
from gpu_efficiency.sources.metrics.prometheus.vector import check_cap
from gpu_efficiency.sources.metrics.targets import (
    locator,
    merged_rows,
    on_node_targets,
)

NAN = math.nan

#: One window's aggregates: (UUID, GPU_I_ID) -> signal -> its aggregate row (NaN: not returned).
WindowValues = dict[tuple[str, str], dict[Signal, list[float]]]
#: A fault window's aggregates kept apart per scrape target: (UUID, GPU_I_ID) -> instance -> rows.
TargetValues = dict[tuple[str, str], dict[str, dict[Signal, list[float]]]]
#: ``SIGNAL:agg`` tag -> the signal and the aggregate's index in its row.
_TAGS: dict[str, tuple[Signal, int]] = {
    f"{s.name}:{agg}": (s, FIELDS.index(agg)) for s in Signal for agg in AGGREGATIONS
}


def fold_window(chunks: Iterable[Iterable[Mapping[str, Any]]], max_series: int = 0) -> WindowValues:
    """A window query's series (each tagged ``SIGNAL:agg`` for one GPU key) as ``WindowValues``;
    SourceUnavailable past ``max_series`` series (0: no cap)."""
    out: WindowValues = {}
    tags, fields = _TAGS, WIDTH
    last_key: tuple[str, str] | None = None
    per_gpu: dict[Signal, list[float]] = {}
    seen = 0
    try:
        for items in chunks:
            if not isinstance(items, list):
                items = list(items)
            seen += len(items)
            check_cap(seen, max_series)
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


#: Signals served under one name by every generation whose unit a public source leaves ambiguous on
#: a 4.9+ GPU (api/exporter_fields.py: MHz or Hz, MiB or bytes): not read as amounts there.
AMBIGUOUS_ON_4_9 = frozenset(
    s
    for s in Signal
    if s.name in FIELDS_BY_SIGNAL
    and FIELDS_BY_SIGNAL[s.name].unit_ambiguous
    and not FIELDS_BY_SIGNAL[s.name].renamed
)


def drop_ambiguous(
    stats: dict[Window, dict[Signal, Stats]], view: ExporterView | None
) -> dict[Window, dict[Signal, Stats]]:
    """``stats`` without the signals whose unit this GPU's generation leaves unknown (copied: the
    activity cache's Stats are shared)."""
    if view is None or view.generation is not Generation.V4_9:
        return stats
    return {w: {s: v for s, v in by.items() if s not in AMBIGUOUS_ON_4_9} for w, by in stats.items()}


def fold_target_window(chunks: Iterable[Iterable[Mapping[str, Any]]], max_series: int = 0) -> TargetValues:
    """A fault window query's series (tagged ``SIGNAL:agg`` per GPU key and ``instance``) as
    ``TargetValues``; SourceUnavailable past ``max_series`` series. Few GPUs (the fault candidates),
    so no fast path as in ``fold_window``."""
    out: TargetValues = {}
    seen = 0
    try:
        for items in chunks:
            if not isinstance(items, list):
                items = list(items)
            seen += len(items)
            check_cap(seen, max_series)
            for item in items:
                labels = item.get("metric") or {}
                uuid, found = labels.get("UUID"), _TAGS.get(labels.get(AGG_LABEL, ""))
                if not uuid or found is None:
                    continue
                instance, gpu_i = labels.get(TARGET_LABEL, ""), labels.get("GPU_I_ID", "")
                if type(uuid) is not str or type(gpu_i) is not str or type(instance) is not str:
                    raise TypeError(f"GPU labels {uuid!r}/{gpu_i!r}/{instance!r} are not strings")
                per_target = out.setdefault((uuid, gpu_i), {}).setdefault(instance, {})
                signal, index = found
                row = per_target.get(signal)
                if row is None:
                    row = per_target[signal] = [NAN] * WIDTH
                try:
                    row[index] = float(item["value"][1])
                except (KeyError, IndexError, TypeError, ValueError):
                    row[index] = NAN
    except (AttributeError, TypeError) as exc:
        raise SourceUnavailable(f"Prometheus returned a malformed series: {exc}") from exc
    return out


def merge_window(old: Any, new: Any) -> Any:
    """Two answers of one window split by signal (``promql.restricted_queries``) as one: their
    signals are disjoint, so a GPU's (or a target's) rows are joined per signal."""
    if old is None:
        return new
    if isinstance(old, TrustedRows) and isinstance(new, TrustedRows):
        for key, by_target in new.values.items():
            mine = old.values.setdefault(key, {})
            for target, rows in by_target.items():
                mine.setdefault(target, {}).update(rows)
        return old
    for key, rows in new.items():
        old.setdefault(key, {}).update(rows)
    return old


class TrustedRows:
    """A fault window's ``TargetValues`` read as ``Rows``: a GPU's rows are those of the targets
    ``samples`` trusts for it (``trusted``), merged; the other targets' rows are dropped and counted."""

    def __init__(self, values: TargetValues) -> None:
        self.values = values
        self.drops: DropTally | None = None  # set by ``samples``
        self.trusted: frozenset[str] | None = None  # set by ``samples`` before each pop

    def pop(self, key: tuple[str, str], default: None, /) -> dict[Signal, list[float]] | None:
        by_target = self.values.pop(key, None)
        if by_target is None:
            return default
        if self.trusted is None:  # no target check: every target's rows, as max by (UUID) did
            chosen = list(by_target.values())
        else:
            chosen = [rows for target, rows in by_target.items() if target in self.trusted]
            if self.drops is not None:
                self.drops.add(DropReason.FAULT_OFF_TARGET, len(by_target) - len(chosen))
        if not chosen:
            return default
        if len(chosen) == 1:
            return chosen[0]
        signals = {signal for rows in chosen for signal in rows}
        return {s: merged_rows(rows[s] for rows in chosen if s in rows) for s in signals}


class Rows(Protocol):
    """A window's rows by GPU key, consumed by ``samples`` (a ``WindowValues`` dict, or lazier)."""

    def pop(self, key: tuple[str, str], default: None, /) -> dict[Signal, list[float]] | None: ...


class Overlay:
    """The cached windows a tiered cycle reuses, over the rows it fetched (chain-only rows of a
    chain-refreshed GPU are superseded by its whole cached window, which already holds them)."""

    def __init__(self, reused: ReusedRows, fresh: WindowValues) -> None:
        self.reused, self.fresh = reused, fresh

    def pop(self, key: tuple[str, str], default: None, /) -> dict[Signal, list[float]] | None:
        fetched = self.fresh.pop(key, default)
        rows = self.reused.pop(key, default)
        return rows if rows is not None else fetched


def samples(
    identity: Mapping[GPUKey, Identity],
    windows: Mapping[Window, Rows],
    request: FetchRequest,
    *,
    built: Mapping[Window, dict[Key, dict[Signal, Stats]]] | None = None,
    whole: Mapping[Window, WholeStats] | None = None,
    views: Mapping[tuple[str, str], ExporterView] | None = None,
    xids: Mapping[tuple[str, str], Mapping[int, Mapping[int, int]]] | None = None,
    drops: DropTally | None = None,
) -> tuple[GPUSample, ...]:
    """Join identities with the window aggregates (consumed): one GPUSample per GPU, sorted.
    ``built``: carried windows' Stats (``Entry.stats``), taken instead of rows (also consumed);
    their GPU's sample is marked carried, with identity's newest time (``GPUSample.carried_newest``).
    ``whole``: Stats of windows fetched whole this cycle, equal to their rows' (also consumed), not
    marked carried. ``views``: each GPU's generation and blind spots (the inventory query);
    ``xids``: XID events counted, for the GPUs whose exporter serves the counter. With
    ``request.targets`` (the cluster's address book) a GPU is joined only when a scrape target on
    its node reports it, and its fault windows (``TrustedRows``) only from such targets
    (``sources/metrics/targets.py``); what is left out is counted in ``drops``. Without, a GPU two nodes
    claim is dropped (DropReason.NODE_CONFLICT)."""
    expected = {
        w: s / request.scrape_interval for w, s in request.windows.items() if request.scrape_interval > 0
    }
    built = built or {}
    whole = whole or {}
    drops = drops if drops is not None else DropTally()
    locate = locator(request.targets) if request.targets is not None else None
    alone: dict[str, frozenset[str]] = {}  # one target's trusted set, shared by its GPUs
    gpus = []
    for gpu_key, ident in identity.items():
        key = (gpu_key.uuid, gpu_key.instance_id)
        node, pods = ident.node, ident.pods
        trusted: frozenset[str] | None = None
        if locate is not None and len(ident.claims) == 1:  # one target: the usual case, made quick
            ((target, claim),) = ident.claims.items()
            if not claim.node or locate(target) != claim.node:
                drops.add(DropReason.IDENTITY_OFF_NODE)
                _discard(key, windows, built, whole)
                continue
            node, pods = claim.node, claim.pods
            trusted = alone.get(target) or alone.setdefault(target, frozenset((target,)))
        elif locate is not None:  # safety rule 9: the identity only from a target on the GPU's node
            on_node = on_node_targets({t: c.node for t, c in ident.claims.items()}, locate)
            nodes = set(on_node.values())
            drops.add(DropReason.IDENTITY_OFF_NODE, len(ident.claims) - len(on_node))  # per target and GPU
            if len(nodes) != 1:
                drops.add(DropReason.NODE_CONFLICT, int(len(nodes) > 1))
                _discard(key, windows, built, whole)
                continue
            node, trusted = nodes.pop(), frozenset(on_node)
            pods = {p for t in on_node for p in ident.claims[t].pods}
        elif ident.conflict:
            drops.add(DropReason.NODE_CONFLICT)
            _discard(key, windows, built, whole)
            continue
        stats: dict[Window, dict[Signal, Stats]] = {}
        carried: float | None = None
        for window, values in windows.items():
            if isinstance(values, TrustedRows):
                values.trusted, values.drops = trusted, drops
            rows = values.pop(key, None)  # freed as it goes: rows and Stats are not both held
            ready = built[window].pop(key, None) if window in built else None
            own = whole[window].pop(key, None) if window in whole else None
            if ready is not None:
                stats[window], carried = ready, ident.newest
            elif own is not None:
                stats[window] = own
            elif rows is not None:
                stats[window] = rows_stats(rows)
        view = views.get(key) if views is not None else None
        stats = drop_ambiguous(stats, view)
        gpus.append(
            GPUSample(
                node=node,
                uuid=gpu_key.id,
                index=ident.index,
                model=ident.model,
                pods=tuple(sorted(pods, key=lambda p: (p.namespace, p.name, p.container))),
                stats=stats,
                source="prometheus",
                expected_samples=expected,
                fb_total_mib=fb_total(stats.get(Window.ACTIVITY, {})),
                carried_newest=carried,
                exporter=view.generation.value if view is not None else "",
                blind=view.blind if view is not None else frozenset(),
                labels_seen=ident.labels if not node else frozenset(),
                xid_events=(xids or {}).get(key, {}) if view is not None and view.xid_counter else None,
            )
        )
    gpus.sort(key=lambda g: (g.node, g.index, g.uuid))
    return tuple(gpus)


def _discard(
    key: tuple[str, str],
    windows: Mapping[Window, Rows],
    built: Mapping[Window, dict[Key, dict[Signal, Stats]]],
    whole: Mapping[Window, WholeStats],
) -> None:
    """Free a dropped GPU's rows and Stats (``samples`` consumes what it joins)."""
    for window, values in windows.items():
        if isinstance(values, TrustedRows):
            values.trusted, values.drops = frozenset(), None  # counted as the GPU's drop
        values.pop(key, None)
        if window in built:
            built[window].pop(key, None)
        if window in whole:
            whole[window].pop(key, None)


def window_stats(tags: Mapping[str, float]) -> dict[Signal, Stats]:
    """Stats from ``SIGNAL:agg`` -> value (tags of unknown signals or aggregates ignored)."""
    rows: dict[Signal, list[float]] = {}
    for tag, value in tags.items():
        found = _TAGS.get(tag)
        if found is not None:
            signal, index = found
            rows.setdefault(signal, [NAN] * WIDTH)[index] = value
    return rows_stats(rows)


def fb_total(activity: Mapping[Signal, Stats]) -> float | None:
    used, free = activity.get(Signal.FB_USED), activity.get(Signal.FB_FREE)
    if used is None or free is None:
        return None
    total = used.last + free.last
    return total if math.isfinite(total) and total > 0 else None
