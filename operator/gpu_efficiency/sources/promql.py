"""Build the cycle's PromQL: one query per window whatever the cluster size.

Every (signal, aggregation) pair of a window is reduced ``by (UUID, GPU_I_ID)`` and tagged with a
``gpueff_agg`` label, then joined with ``or``. Prometheus returns small series (two labels), and one
extra identity query carries the full labels (node, model, pods) once per GPU. Query count stays
constant: 1 identity + 1 per window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.engine.model import Signal, Window

#: Labels that identify one GPU (or MIG instance) across every metric.
GPU_KEY_LABELS = ("UUID", "GPU_I_ID")
AGG_LABEL = "gpueff_agg"

#: The clock-event bitmask was renamed; read both names.
OLD_CLOCK_EVENTS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

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

#: What each window aggregates. Fields a window does not list stay NaN in Stats ("not measured").
QUERY_PLAN: Mapping[Window, Mapping[Signal, tuple[str, ...]]] = {
    Window.ACTIVITY: {
        Signal.SM_ACTIVE: _ACTIVITY,
        Signal.GR_ENGINE_ACTIVE: _ACTIVITY,
        Signal.GPU_UTIL: (*_ACTIVITY, "stddev"),
        Signal.SM_OCCUPANCY: ("avg", "count"),
        Signal.TENSOR_ACTIVE: ("avg", "count"),
        Signal.DRAM_ACTIVE: ("avg", "count"),
        Signal.PCIE_RX_BYTES: ("avg", "max", "count"),
        Signal.PCIE_TX_BYTES: ("avg", "count"),
        Signal.NVLINK_RX_BYTES: ("avg", "count"),
        Signal.NVLINK_TX_BYTES: ("avg", "count"),
        Signal.FB_USED: ("avg", "max", "min", "last", "count"),
        Signal.FB_FREE: ("last", "count"),
        Signal.POWER: ("avg", "stddev", "count"),
        Signal.GPU_TEMP: ("max", "avg", "count"),
        Signal.MEMORY_TEMP: ("max", "count"),
        Signal.CLOCK_EVENTS: ("last", "max", "min", "count"),
    },
    Window.FAULT: {
        Signal.ECC_DBE_VOLATILE: _FAULT_COUNTER,
        Signal.XID: ("last", "changes", "min", "max", "count", "ts"),
        Signal.REMAPPED_ROWS_UNCORRECTABLE: _FAULT_COUNTER,
        Signal.ROW_REMAP_FAILURE: ("max", "last", "count", "ts"),
        Signal.RETIRED_PAGES_PENDING: ("max", "last", "count", "ts"),
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

#: Metrics whose labels say which GPU belongs to which node and pod (any one suffices).
IDENTITY_METRICS = (Signal.GPU_UTIL, Signal.GR_ENGINE_ACTIVE, Signal.SM_ACTIVE, Signal.FB_USED)


@dataclass(frozen=True, slots=True)
class Query:
    window: Window | None  # None: the identity query
    text: str


def _selector(signal: Signal, matchers: str) -> str:
    if signal is Signal.CLOCK_EVENTS:
        names = f"{Signal.CLOCK_EVENTS.value}|{OLD_CLOCK_EVENTS}"
        return '{__name__=~"' + names + '"' + (f",{matchers}" if matchers else "") + "}"
    return signal.value + (f"{{{matchers}}}" if matchers else "")


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _term(signal: Signal, agg: str, seconds: float, matchers: str) -> str:
    sel = _selector(signal, matchers)
    inner = f"timestamp({sel})" if agg == "ts" else f"{_RANGE_FUNCS[agg]}({sel}[{_duration(seconds)}])"
    by = ", ".join(GPU_KEY_LABELS)
    return f'label_replace(max by ({by}) ({inner}), "{AGG_LABEL}", "{signal.name}:{agg}", "", "")'


def window_query(window: Window, seconds: float, matchers: str = "") -> Query:
    """One query returning every aggregation of every signal this window needs."""
    terms = [_term(sig, agg, seconds, matchers) for sig, aggs in QUERY_PLAN[window].items() for agg in aggs]
    return Query(window=window, text=" or ".join(terms))


def identity_query(matchers: str = "") -> Query:
    """Full label sets of every GPU series seen now (one series per GPU and attributed pod)."""
    names = "|".join(sig.value for sig in IDENTITY_METRICS)
    sel = '{__name__=~"' + names + '"' + (f",{matchers}" if matchers else "") + "}"
    return Query(window=None, text=f"group without (__name__) ({sel})")


def cycle_queries(windows: Mapping[Window, float], matchers: str = "") -> Sequence[Query]:
    """All queries of one cycle: constant in number, whatever the number of GPUs."""
    return [identity_query(matchers)] + [window_query(w, s, matchers) for w, s in windows.items() if s > 0]
