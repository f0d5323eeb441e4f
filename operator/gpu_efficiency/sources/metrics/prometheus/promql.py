"""Build the cycle's PromQL: one query per window whatever the cluster size.

Every (signal, aggregation) pair of a window is reduced ``by (UUID, GPU_I_ID)`` and tagged with a
``gpueff_agg`` label, then joined with ``or`` (fault windows also by ``instance``: the scrape target,
see ``TARGET_LABEL``). Prometheus returns small series (two or three labels), and one
extra identity query carries the full labels (node, model, pods) once per GPU. Query count stays
constant: 1 identity + the inventory where an exporter may have changed (``inventory_cache.py``) +
1 per window (a filtered window fetched for its candidates is split into a fixed ``WINDOW_PARTS``
queries, and a window whose matchers take it past ``MAX_QUERY_BYTES`` into parts of whole signals).

Every query stays under ``MAX_QUERY_BYTES`` (VictoriaMetrics' default ``-search.maxQueryLen``;
Thanos, Mimir and Cortex have limits of their own), whatever the number of GPUs, candidates and
held nodes: a long list is traded for a wider selection that gives the same answer (held nodes:
every GPU; candidates: the filter over every GPU), never for a refused query. The tiered refresh's
listed activity queries (``--prometheus-refresh-budget`` > 0, ``prometheus/tiered/fetch.py``) are cut
to fit too (``listed_window_queries``: the window in parts of whole signals, the list in chunks;
the idle candidates' chain as raw samples, each UUID listed once: ``tiered/chain_samples.py``).

Every exporter generation is read (``api/exporter_fields.py``): a signal served under both DCGM
name families is selected with one ``__name__`` regex where the units agree, and as ``old or
new * factor`` where they do not (GPU_UTIL: percent vs ratio), so the engine sees one unit and a
GPU serving both names (a double scrape) is read once, the old name first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.engine import ACTIVITY_CHAIN, BUSY_UTIL_PERCENT
from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.base import FaultHints
from gpu_efficiency.sources.metrics.prometheus.regex_lists import chunk_alternatives, regex_literal

#: Labels that identify one GPU (or MIG instance) across every metric.
GPU_KEY_LABELS = ("UUID", "GPU_I_ID")
AGG_LABEL = "gpueff_agg"
#: The scrape target a series came from (its address, as Prometheus sets it): fault windows and
#: the identity query keep it, so a fault counts only from the target that reports the GPU on its
#: own node (safety rule 9, ``sources/metrics/targets.py``).
TARGET_LABEL = "instance"

#: The longest query text sent, in bytes: VictoriaMetrics refuses longer ones by default (HTTP 400,
#: ``-search.maxQueryLen=16384``), which left fault windows listing two GPUs unread there.
MAX_QUERY_BYTES = 16384
#: Longest held-node regex: beyond it the held-node filter selects every GPU (a superset: the
#: windows are then fetched for every GPU, same verdicts, more work), so filters stay short.
MAX_HELD_PATTERN_BYTES = 1024

#: The clock-event bitmask was renamed; read both names.
OLD_CLOCK_EVENTS = ef.OLD_CLOCK_EVENTS
#: What one unit is in the engine's (the legacy family's): GPU_UTIL is percent, a ratio is x100.
_TO_ENGINE = {(ef.Unit.RATIO, ef.Unit.PERCENT): 100.0}


def served_names(signal: Signal) -> tuple[tuple[float, tuple[str, ...]], ...]:
    """The metric names ``signal`` is served under, grouped by the factor to the engine's unit
    (factor 1 first: its unit is certain, so a GPU serving both is read in it)."""
    spec = ef.FIELDS_BY_SIGNAL[signal.name]
    same = [spec.legacy] + ([OLD_CLOCK_EVENTS] if signal is Signal.CLOCK_EVENTS else [])
    factor = _TO_ENGINE.get((spec.current_units[0], spec.legacy_unit), 1.0)
    if factor == 1.0 or spec.current == spec.legacy:  # same name: its 4.9+ unit is windows.py's
        return ((1.0, tuple(dict.fromkeys([*same, spec.current]))),)
    return ((1.0, tuple(same)), (factor, (spec.current,)))


def name_regex(names: Sequence[str]) -> str:
    """``a|b`` as a shorter RE2 alternation with their common prefix and suffix factored out
    (``DCGM_FI_PROF_SM_(ACTIVE|UTIL_RATIO)``): every window query repeats it per aggregate."""
    if len(names) == 1:
        return names[0]
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    rests = [n[len(prefix) :] for n in names]
    suffix = rests[0]
    for rest in rests[1:]:
        while not rest.endswith(suffix):
            suffix = suffix[1:]
    middles = [r[: len(r) - len(suffix)] for r in rests]
    return f"{prefix}({'|'.join(middles)}){suffix}"


def _names_selector(names: Sequence[str], matchers: str) -> str:
    if len(names) == 1:
        return names[0] + (f"{{{matchers}}}" if matchers else "")
    return '{__name__=~"' + name_regex(names) + '"' + (f",{matchers}" if matchers else "") + "}"


#: Range functions whose value scales with the sample values (count, changes, resets do not).
_SCALED = frozenset({"max_over_time", "avg_over_time", "min_over_time", "last_over_time", "stddev_over_time"})


def over(signal: Signal, func: str, window: str, matchers: str) -> str:
    """``func(signal[window])`` per series, in the engine's unit, over every name it is served under."""
    parts = []
    for factor, names in served_names(signal):
        expr = f"{func}({_names_selector(names, matchers)}[{window}])"
        parts.append(expr if factor == 1.0 or func not in _SCALED else f"{expr} * {factor:g}")
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def timestamps_of(signal: Signal, matchers: str) -> str:
    """``timestamp(signal)`` per series, over every name it is served under."""
    parts = [f"timestamp({_names_selector(names, matchers)})" for _, names in served_names(signal)]
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


_RANGE_FUNCS = {
    "max": "max_over_time",
    "avg": "avg_over_time",
    "min": "min_over_time",
    "last": "last_over_time",
    "count": "count_over_time",
    "stddev": "stddev_over_time",
    "changes": "changes",
    "resets": "resets",
}
AGGREGATIONS = (*_RANGE_FUNCS, "ts")

_ACTIVITY = ("max", "avg", "count", "ts")
_FAULT_COUNTER = ("min", "max", "last", "resets", "count", "ts")
_LINK = ("min", "max", "last", "count", "ts")

#: What each window aggregates. Fields a window does not list stay NaN in Stats ("not measured").
#: A signal the diagnosis reads needs avg, max, count and ts: the engine trusts no signal without
#: coverage, freshness and values in range (activity.insufficiency). PCIe TX and memory temperature
#: are shown by explain only.
QUERY_PLAN: Mapping[Window, Mapping[Signal, tuple[str, ...]]] = {
    Window.ACTIVITY: {
        Signal.SM_ACTIVE: _ACTIVITY,
        Signal.GR_ENGINE_ACTIVE: _ACTIVITY,
        Signal.GPU_UTIL: (*_ACTIVITY, "stddev"),
        Signal.SM_OCCUPANCY: ("avg", "max", "count", "ts"),
        Signal.TENSOR_ACTIVE: ("avg", "max", "count", "ts"),
        Signal.DRAM_ACTIVE: ("avg", "max", "count", "ts"),
        Signal.PCIE_RX_BYTES: ("avg", "max", "count", "ts"),
        Signal.PCIE_TX_BYTES: ("avg", "count"),
        Signal.NVLINK_RX_BYTES: ("avg", "max", "count", "ts"),
        Signal.NVLINK_TX_BYTES: ("avg", "max", "count", "ts"),
        Signal.FB_USED: ("avg", "max", "min", "last", "count", "ts"),
        Signal.FB_FREE: ("avg", "max", "last", "count", "ts"),
        Signal.POWER: ("avg", "max", "stddev", "count", "ts"),
        Signal.SM_CLOCK: ("avg", "max", "count", "ts"),  # stragglers: a GPU clocked below its peers
        Signal.GPU_TEMP: ("max", "avg", "count", "ts"),
        Signal.MEMORY_TEMP: ("max", "count"),
        Signal.CLOCK_EVENTS: ("avg", "last", "max", "min", "count", "ts"),
    },
    Window.FAULT: {
        Signal.ECC_DBE_VOLATILE: _FAULT_COUNTER,
        Signal.XID: ("last", "changes", "min", "max", "count", "ts"),
        Signal.REMAPPED_ROWS_UNCORRECTABLE: _FAULT_COUNTER,
        Signal.ROW_REMAP_FAILURE: ("max", "last", "count", "ts"),
        Signal.RETIRED_PAGES_PENDING: ("max", "last", "count", "ts"),
        # PCIe link (engine/quarantine/pcie.py): fetched for the GPUs the fault filter names only.
        Signal.PCIE_LINK_WIDTH: _LINK,
        Signal.PCIE_MAX_LINK_WIDTH: _LINK,
        Signal.PCIE_LINK_GEN: _LINK,
        Signal.PCIE_MAX_LINK_GEN: _LINK,
        Signal.GPU_UTIL: ("min", "count", "ts"),  # busy in every sample: the generation counts
    },
    Window.THERMAL_HOLD: {
        Signal.GPU_TEMP: ("min", "max", "last", "count", "ts"),
        Signal.MEMORY_TEMP: ("min", "max", "last", "count", "ts"),
        Signal.CLOCK_EVENTS: ("min", "max", "last", "count", "ts"),
    },
    Window.THERMAL_RECOVERY: {
        Signal.GPU_TEMP: ("max", "min", "last", "count", "ts"),
        Signal.MEMORY_TEMP: ("max", "min", "last", "count", "ts"),
        Signal.CLOCK_EVENTS: ("max", "min", "last", "count", "ts"),
    },
}

#: Labels read from the identity query; the rest (job, driver version, ...) is not transferred.
IDENTITY_LABELS = (
    *GPU_KEY_LABELS,
    "gpu",
    "modelName",
    *ef.NODE_LABELS,
    "pod",
    "namespace",
    "container",
    "exported_pod",
    "exported_namespace",
    "exported_container",
    "pod_name",
    "pod_namespace",
    "container_name",
    TARGET_LABEL,
)

#: Thermal slowdown clock-event bits: HW_SLOWDOWN (3), SW_THERMAL (5), HW_THERMAL (6).
THERMAL_BITS = (3, 5, 6)


def thermal_bits_expr(value: str) -> str:
    """``value`` (one selection) if its clock-event bitmask has bit 3, 5 or 6 set, else nothing.

    One comparison instead of one term per bit: each term selects the metric again, and at 8,000
    GPUs every selection costs Prometheus ~0.1 CPU-second. With z = value mod 128, bit 5 or 6 is set
    iff z >= 32, and clamping z to 31 then sets bit 3 (31 mod 16 = 15), so one ``mod 16 >= 8`` test
    covers all three; negative, NaN and infinite values never match, as with the per-bit terms.
    """
    return f"clamp_max({value} % 128, 31) % 16 >= 8"


#: Fault signals any non-zero value of which makes a GPU worth fetching in full.
FAULT_SIGNALS = (
    Signal.ECC_DBE_VOLATILE,
    Signal.XID,
    Signal.REMAPPED_ROWS_UNCORRECTABLE,
    Signal.ROW_REMAP_FAILURE,
    Signal.RETIRED_PAGES_PENDING,
)

#: Metrics whose labels say which GPU belongs to which node and pod (any one suffices).
IDENTITY_METRICS = (Signal.GPU_UTIL, Signal.GR_ENGINE_ACTIVE, Signal.SM_ACTIVE, Signal.FB_USED)


@dataclass(frozen=True, slots=True)
class Query:
    window: Window | None  # None: the identity (or candidates) query
    text: str
    candidates: bool = False  # names the GPUs whose fault windows to fetch (see ``candidates_query``)
    checks_links: bool = False  # candidates with the PCIe link terms over every GPU (``link_check.py``)
    idle: bool = False  # names the GPUs that may be idle (see ``idle_candidates_query``)
    inventory: bool = False  # each GPU's generation and served signals (``sources/metrics/prometheus/exporter_inventory.py``)
    xid_counts: bool = False  # XID events per GPU and code (``sources/metrics/prometheus/xid_counts.py``)
    #: A plain range selector: raw samples, aggregated by the source (``tiered/chain_samples.py``).
    samples: bool = False
    #: With ``samples``: the whole activity window's names, not the chain's (``whole_sample_queries``).
    whole: bool = False
    #: The GPU keys kept from the answer (None: all): a listed window's filter, applied by the source.
    keys: frozenset[tuple[str, str]] | None = None


def _selector(signal: Signal, matchers: str) -> str:
    """Every name of ``signal`` whose unit is the engine's (for a unit-free use: a filter on labels)."""
    return _names_selector(served_names(signal)[0][1], matchers)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _term(signal: Signal, agg: str, seconds: float, matchers: str, per_target: bool = False) -> str:
    inner = (
        timestamps_of(signal, matchers)
        if agg == "ts"
        else over(signal, _RANGE_FUNCS[agg], _duration(seconds), matchers)
    )
    by = ", ".join((*GPU_KEY_LABELS, TARGET_LABEL) if per_target else GPU_KEY_LABELS)
    return f'label_replace(max by ({by}) ({inner}), "{AGG_LABEL}", "{signal.name}:{agg}", "", "")'


def union(terms: Sequence[str]) -> str:
    """``a or b or c ...`` as a balanced tree of parenthesised pairs.

    Prometheus evaluates ``or`` left to right, re-hashing the growing left side at every step, so a
    flat chain of T terms over N GPUs costs O(T^2 N); the balanced tree gives the same union (the
    terms' label sets are disjoint) in O(T log T N): at 67 terms and 800 GPUs, 2.4 s -> 1.0 s.
    """
    if len(terms) <= 2:
        return " or ".join(terms)
    middle = len(terms) // 2
    return f"({union(terms[:middle])}) or ({union(terms[middle:])})"


def window_query(window: Window, seconds: float, matchers: str = "", only: str | None = None) -> Query:
    """One query returning every aggregation of every signal this window needs (for ``only`` GPUs).
    A fault window's series are kept apart per scrape target (``TARGET_LABEL``): its GPUs are few
    (the candidates), and only the target that reports a GPU's identity counts for its faults."""
    per_target = window in FILTERED_WINDOWS
    terms = [
        _term(sig, agg, seconds, matchers, per_target)
        for sig, aggs in QUERY_PLAN[window].items()
        for agg in aggs
    ]
    text = union(terms)
    if only is not None:
        text = f"({text}) and on ({', '.join(GPU_KEY_LABELS)}) ({only})"
    return Query(window=window, text=text)


def fitting_window_queries(window: Window, seconds: float, matchers: str = "") -> list[Query]:
    """``window_query`` over every GPU, in parts of whole signals where it is longer than
    ``MAX_QUERY_BYTES``: the activity window repeats the matchers in each of its 67 terms, so the
    default matchers plus a namespace (``namespace="gpu-operator"``, as docs/install.md suggests)
    took it to 16.7 KB. Sent whole when not even one signal fits a query: Prometheus has no limit,
    and a store that refuses it says why (the cycle's ``MetricsAvailable`` condition quotes it)."""
    whole = window_query(window, seconds, matchers)
    if len(whole.text.encode()) <= MAX_QUERY_BYTES:
        return [whole]
    return listed_window_queries(window, seconds, None, matchers) or [whole]


def _by_key(expr: str) -> str:
    return f"max by ({', '.join(GPU_KEY_LABELS)}) ({expr})"


def _any_key(condition: str) -> str:
    """The GPUs with any series meeting ``condition`` (a comparison that filters series).

    Filtering before grouping gives the same GPUs as ``max by (...) (x) > t`` (the max of a GPU's
    series exceeds t iff one of them does) while Prometheus regroups only the few series that pass:
    ~35 % less CPU per term at 8,000 GPUs.
    """
    return f"group by ({', '.join(GPU_KEY_LABELS)}) ({condition})"


def _held_nodes(nodes: frozenset[str], matchers: str) -> str | None:
    if not nodes:
        return None
    pattern = "|".join(sorted(regex_literal(n) for n in nodes))
    if len(pattern) > MAX_HELD_PATTERN_BYTES:  # too many to list: every GPU (see the constant)
        return _any_key(_selector(Signal.GPU_TEMP, matchers))
    terms = [
        _any_key(_selector(Signal.GPU_TEMP, (f"{matchers}," if matchers else "") + f'{label}=~"{pattern}"'))
        for label in (ef.NODE_LABEL, ef.OLD_NODE_LABEL)
    ]
    return union(terms)


def _below_max(current: Signal, maximum: Signal, window: str, matchers: str) -> str:
    """GPUs whose ``current`` link value never reached ``maximum`` in the window: a superset of the
    PCIe rule's faults (max current < min maximum), without a flapping link (which is none)."""
    keys = ", ".join(GPU_KEY_LABELS)
    best = over(current, "max_over_time", window, matchers)
    limit = f"max by ({keys}) ({over(maximum, 'max_over_time', window, matchers)})"
    return f"{best} < on ({keys}) group_left {limit}"


def pcie_filter(window: str, matchers: str) -> list[str]:
    """GPUs whose link may be down-trained (``engine/quarantine/pcie.py``): narrower than its maximum over
    the whole window, or slower while busy in every sample. Two cheap terms: an idle GPU's low
    generation (power saving) does not make it a candidate."""
    util = f"{over(Signal.GPU_UTIL, 'min_over_time', window, matchers)} >= {BUSY_UTIL_PERCENT:g}"
    keys = ", ".join(GPU_KEY_LABELS)
    slow = _below_max(Signal.PCIE_LINK_GEN, Signal.PCIE_MAX_LINK_GEN, window, matchers)
    return [
        _any_key(_below_max(Signal.PCIE_LINK_WIDTH, Signal.PCIE_MAX_LINK_WIDTH, window, matchers)),
        _any_key(f"({slow}) and on ({keys}) ({util})"),
    ]


def fault_filter(seconds: float, hints: FaultHints, matchers: str, links: bool = True) -> str:
    """GPUs whose fault window can hold a fault: any non-zero fault signal, a down-trained PCIe link
    (unless ``links`` is False: ``link_check.py``), or a held node."""
    window = _duration(seconds)
    parts = [_any_key(f"{over(sig, 'max_over_time', window, matchers)} > 0") for sig in FAULT_SIGNALS]
    counted = f'{ef.XID_COUNT}{{{ef.XID_LABEL}!=""' + (f",{matchers}" if matchers else "") + "}"
    parts.append(_any_key(f"max_over_time({counted}[{window}]) > 0"))  # XIDs counted (4.8.3+)
    if links:
        parts.extend(pcie_filter(window, matchers))
    held = _held_nodes(hints.held_nodes, matchers)
    return union(parts + ([held] if held else []))


def thermal_filter(seconds: float, hints: FaultHints, matchers: str) -> str:
    """GPUs that may be thermally faulted: hot, a thermal clock-event bit now, or on a held node."""
    window = _duration(seconds)
    parts = []
    if hints.gpu_temperature_above is not None:
        hot = over(Signal.GPU_TEMP, "max_over_time", window, matchers)
        parts.append(_any_key(f"{hot} > {hints.gpu_temperature_above:g}"))
    if hints.memory_temperature_above is not None:
        hot = over(Signal.MEMORY_TEMP, "max_over_time", window, matchers)
        parts.append(_any_key(f"{hot} > {hints.memory_temperature_above:g}"))
    parts.append(_any_key(thermal_bits_expr(over(Signal.CLOCK_EVENTS, "last_over_time", window, matchers))))
    held = _held_nodes(hints.held_nodes, matchers)
    return union(parts + ([held] if held else []))


def identity_query(matchers: str = "", timestamps: bool = False) -> Query:
    """The labels of every GPU series seen now (one series per GPU and attributed pod).

    With ``timestamps`` each series' value is the GPU's newest sample time (of any identity metric):
    what a cached activity window's freshness is judged by (see ``sources/metrics/prometheus/tiered/activity_cache.py``).
    ``timestamp()`` drops ``__name__``, so one target's series of a GPU then share a label set and
    ``or`` keeps the first metric's: they came from one scrape, hence carry one time (a stale series
    is not selected at all). Series of other targets keep other label sets and the ``max`` picks the
    newest. Tagging each metric apart with ``label_replace`` instead cost Prometheus ~2x the CPU.
    """
    names = "|".join(name for sig in IDENTITY_METRICS for _, group in served_names(sig) for name in group)
    sel = '{__name__=~"' + names + '"' + (f",{matchers}" if matchers else "") + "}"
    labels = ", ".join(IDENTITY_LABELS)
    if timestamps:
        parts = [timestamps_of(sig, matchers) for sig in IDENTITY_METRICS]
        return Query(window=None, text=f"max by ({labels}) ({union(parts)})")
    return Query(window=None, text=f"group by ({labels}) ({sel})")


#: The idle-candidates filter errs towards naming a GPU: a peak within this relative margin above
#: the threshold counts as below it (float rounding of percent vs fraction never hides an idle GPU).
IDLE_MARGIN = 1e-6


def idle_limit(idle_below: float, scale: float) -> float:
    """The threshold in a chain signal's own unit (GPU_UTIL is percent), widened by ``IDLE_MARGIN``."""
    return idle_below / scale * (1.0 + IDLE_MARGIN)


def idle_candidates_query(seconds: float, idle_below: float, matchers: str = "") -> Query:
    """GPUs whose peak over the window is below the idle threshold on ANY activity-chain signal.

    One cheap filter per chain signal over every GPU (~0.1 s each at 8,000 GPUs): a GPU it does
    not name has, on every chain signal it reports, a current peak at or above the threshold.
    """
    window = _duration(seconds)
    parts = [
        _by_key(over(signal, "max_over_time", window, matchers)) + f" < {idle_limit(idle_below, scale)!r}"
        for signal, _, scale in ACTIVITY_CHAIN
    ]
    return Query(window=None, text=union(parts), idle=True)


def listed_window_queries(
    window: Window,
    seconds: float,
    alternatives: Sequence[str] | None,
    matchers: str = "",
    *,
    chain_only: bool = False,
    around: tuple[str, str] = ("", ""),
    keys: frozenset[tuple[str, str]] | None = None,
    limit: int | None = None,
) -> list[Query] | None:
    """``window_query`` (its activity-chain signals only with ``chain_only``) over the GPUs whose
    ``UUID`` matches ``around[0] + "a|b|..." + around[1]`` (``alternatives``: regex pieces, already
    escaped; None: every GPU), in the fewest queries that each fit ``limit`` (``MAX_QUERY_BYTES``).

    The pattern is repeated in every selector (76 in the whole activity window: ~3.1 KB per listed
    UUID beside the window's own ~15 KB), so the window is cut into parts of whole signals (their
    answers merge per signal) and the alternatives into chunks; every number of parts is tried and
    the one needing the fewest queries kept. None when nothing fits (a piece too long for any part).
    """
    limit = MAX_QUERY_BYTES if limit is None else limit
    chain = {signal for signal, _, _ in ACTIVITY_CHAIN}
    items = [(sig, aggs) for sig, aggs in QUERY_PLAN[window].items() if not chain_only or sig in chain]
    extra = (f"{matchers}," if matchers else "") + 'UUID=~"\x00"'

    per_target = window in FILTERED_WINDOWS

    def text(part: Sequence[tuple[Signal, tuple[str, ...]]], listed: str) -> str:
        return union([_term(sig, agg, seconds, listed, per_target) for sig, aggs in part for agg in aggs])

    best: list[tuple[Sequence[tuple[Signal, tuple[str, ...]]], list[str]]] | None = None
    for count in range(1, len(items) + 1):
        cut: list[tuple[Sequence[tuple[Signal, tuple[str, ...]]], list[str]]] = []
        for part in _cut(items, count):
            if alternatives is None:
                if len(text(part, matchers).encode()) > limit:
                    break
                cut.append((part, [""]))
                continue
            model = text(part, extra).encode()
            chunks = chunk_alternatives(
                alternatives, around, model.count(b"\x00"), limit - len(model) + model.count(b"\x00")
            )
            if chunks is None:
                break
            cut.append((part, chunks))
        else:
            if best is None or sum(len(c) for _, c in cut) < sum(len(c) for _, c in best):
                best = cut
    if best is None:
        return None
    return [
        Query(
            window=window,
            text=text(part, matchers if alternatives is None else extra.replace("\x00", pattern)),
            keys=keys,
        )
        for part, patterns in best
        for pattern in patterns
    ]


def _cut(
    items: Sequence[tuple[Signal, tuple[str, ...]]], count: int
) -> list[Sequence[tuple[Signal, tuple[str, ...]]]]:
    """``items`` in ``count`` runs of whole signals with about as many selectors each (the bytes a
    listed pattern adds follow the selectors: GPU_UTIL's terms select two names each)."""
    weights = [len(aggs) * len(served_names(sig)) for sig, aggs in items]
    total = sum(weights)
    parts: list[list[tuple[Signal, tuple[str, ...]]]] = [[] for _ in range(count)]
    start = 0
    for item, weight in zip(items, weights, strict=True):
        parts[min(count - 1, start * count // total)].append(item)
        start += weight
    return [part for part in parts if part]


#: Windows fetched only for the GPUs their filter names when the source has hints.
FILTERED_WINDOWS = (Window.FAULT, Window.THERMAL_HOLD, Window.THERMAL_RECOVERY)
#: Label of the candidates query's series: the window the GPU must be fetched for.
CANDIDATE_LABEL = "gpueff_window"
#: Beyond this many candidate GPUs a window is fetched with its filter over every GPU instead.
MAX_LISTED_GPUS = 500
#: Queries a filtered window's fetch is split into (``restricted_queries``): within
#: ``MAX_QUERY_BYTES`` the fault window's 49 terms list ~16 candidates' UUIDs in 4 parts (2 in one),
#: the thermal windows' 15 terms ~20 in one (measured with the default matchers).
WINDOW_PARTS: Mapping[Window, int] = {Window.FAULT: 4}
#: The most queries of one filtered window.
MAX_WINDOW_PARTS = max(WINDOW_PARTS.values())


def window_filter(
    window: Window, seconds: float, hints: FaultHints, matchers: str, links: bool = True
) -> str | None:
    """The GPUs a filtered window must cover (None: the window has no GPU to fetch); ``links``: with
    the fault filter's PCIe link terms."""
    if window is Window.FAULT:
        return fault_filter(seconds, hints, matchers, links)
    if window is Window.THERMAL_HOLD:
        return thermal_filter(seconds, hints, matchers)
    if window is Window.THERMAL_RECOVERY:
        return _held_nodes(hints.held_nodes, matchers)
    return None


def cycle_queries(
    windows: Mapping[Window, float], matchers: str = "", hints: FaultHints | None = None
) -> Sequence[Query]:
    """All queries of one cycle: at most one per window plus identity, whatever the number of GPUs.

    With hints, fault windows return only GPUs that may be faulted; the recovery window is skipped
    when no node is held, since only held nodes can recover.
    """
    queries = [identity_query(matchers)]
    for window, seconds in windows.items():
        if seconds <= 0:
            continue
        if hints is None or window not in FILTERED_WINDOWS:
            queries += fitting_window_queries(window, seconds, matchers)
            continue
        only = window_filter(window, seconds, hints, matchers)
        if only is not None:
            queries.append(window_query(window, seconds, matchers, only))
    return queries


def candidates_query(
    windows: Mapping[Window, float], hints: FaultHints, matchers: str = "", links: bool = True
) -> Query | None:
    """One query naming, per filtered window, the GPUs its filter selects (usually none).

    Prometheus evaluates both sides of ``window and on (...) filter``, so a filtered window query
    costs as much as an unfiltered one even when the filter is empty (at 8,000 GPUs, seconds).
    Asking for the candidates first and then for each window over only their ``UUID``s
    (``restricted_queries``) gives the same series for a fraction of the work. ``links`` False
    leaves out the fault filter's PCIe link terms (the source then adds the GPUs its last link check
    named: ``link_check.py``).
    """
    parts = []
    for window, seconds in windows.items():
        if seconds <= 0 or window not in FILTERED_WINDOWS:
            continue
        only = window_filter(window, seconds, hints, matchers, links)
        if only is not None:
            parts.append(f'label_replace({_any_key(only)}, "{CANDIDATE_LABEL}", "{window.value}", "", "")')
    if not parts:
        return None
    checks = links and windows.get(Window.FAULT, 0.0) > 0
    return Query(window=None, text=union(parts), candidates=True, checks_links=checks)


def window_parts(window: Window) -> list[list[tuple[Signal, tuple[str, ...]]]]:
    """The window's plan cut into ``WINDOW_PARTS[window]`` runs of whole signals with about as
    many terms each: every signal's aggregates in one query, so the parts' answers merge per
    signal (``merge_window``)."""
    plan = list(QUERY_PLAN[window].items())
    count = WINDOW_PARTS.get(window, 1)
    total = sum(len(aggs) for _, aggs in plan)
    parts: list[list[tuple[Signal, tuple[str, ...]]]] = [[] for _ in range(count)]
    start = 0
    for signal, aggs in plan:
        parts[min(count - 1, start * count // total)].append((signal, aggs))
        start += len(aggs)
    return [part for part in parts if part]


def restricted_queries(
    window: Window, seconds: float, hints: FaultHints, keys: Iterable[tuple[str, str]], matchers: str = ""
) -> list[Query]:
    """``cycle_queries``' query of a filtered window for the GPUs the candidates query named
    (``keys``; same result when they are every GPU its filter selects), in ``WINDOW_PARTS[window]``
    queries (a fixed number: forged candidates add none), each under ``MAX_QUERY_BYTES``.

    The candidates' ``UUID``s are listed in every selector; the filter is not sent again but
    applied to the answer (``Query.keys``): its own selectors, listed too, made a two-GPU fault
    window 16 KB. When the list does not fit (or exceeds ``MAX_LISTED_GPUS``), each part goes over
    every GPU with the filter, as ``cycle_queries`` sends it."""
    wanted = frozenset(keys)
    listed = sorted({uuid for uuid, _ in wanted})
    per_target = window in FILTERED_WINDOWS
    parts = window_parts(window)

    def texts(matchers: str) -> list[str]:
        return [
            union([_term(sig, agg, seconds, matchers, per_target) for sig, aggs in part for agg in aggs])
            for part in parts
        ]

    if len(listed) <= MAX_LISTED_GPUS:
        pattern = "|".join(regex_literal(u) for u in listed)
        bodies = texts((f"{matchers}," if matchers else "") + f'UUID=~"{pattern}"')
        if all(len(body.encode()) <= MAX_QUERY_BYTES for body in bodies):
            return [Query(window=window, text=body, keys=wanted) for body in bodies]
    only = window_filter(window, seconds, hints, matchers)
    if only is None:  # no filter: nothing of this window is wanted beyond the listed keys
        return [Query(window=window, text=body, keys=wanted) for body in texts(matchers)]
    keys_on = ", ".join(GPU_KEY_LABELS)
    return [Query(window=window, text=f"({body}) and on ({keys_on}) ({only})") for body in texts(matchers)]
