"""XID events counted, where dcgm-exporter serves ``DCGM_EXP_XID_ERRORS_COUNT``.

The XID gauge holds the last code only: a second XID 79 after the first leaves it unchanged, so
repeat rules and incident counts built on it undercount. dcgm-exporter's counter
(``internal/pkg/collector/xid_collector.go``) has one series per GPU and code (label ``xid``)
whose value is the number of that code's events within the last ``window_size_in_ms`` (5 minutes
by default): not monotonic, it falls as events leave the window. The events that arrived within a
duration are then the sum of its positive steps: a new series counts from 0. Steps are taken every
15 s (``STEP``), whatever the scrape interval (a value between scrapes is the last one, so each
step is counted once); an arrival and an expiry inside one step cancel, so a count can be low,
never high (no false repeat). One query per cycle, over the (few) series with an ``xid`` label,
one term per duration the policy needs (the fault lookback, each repeat rule's ``within``, 1 h for
flood counts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from gpu_efficiency.api.exporter_fields import XID_COUNT, XID_LABEL
from gpu_efficiency.engine import DropReason
from gpu_efficiency.sources.metrics.base import DropTally
from gpu_efficiency.sources.metrics.labels import valid_key
from gpu_efficiency.sources.metrics.prometheus.promql import Query, union

STEP = "15s"
WITHIN_LABEL = "gpueff_within"

#: (UUID, GPU_I_ID) -> duration (s) -> XID code -> events within it.
XidEvents = dict[tuple[str, str], dict[int, dict[int, int]]]


def events_expr(seconds: int, matchers: str) -> str:
    """Events per GPU and code that arrived within the last ``seconds`` (see the module docstring)."""
    sel = f'{XID_COUNT}{{{XID_LABEL}!=""' + (f",{matchers}" if matchers else "") + "}"
    steps = f"clamp_min({sel} - ({sel} offset {STEP} * 1 or {sel} * 0), 0)"
    return f"max by (UUID, GPU_I_ID, {XID_LABEL}) (sum_over_time(({steps})[{seconds}s:{STEP}]))"


def query(durations: Sequence[float], matchers: str = "") -> Query | None:
    """One query for every duration (None when there is none)."""
    seconds = sorted({max(1, round(d)) for d in durations if d > 0})
    if not seconds:
        return None
    terms = [f'label_replace({events_expr(s, matchers)}, "{WITHIN_LABEL}", "{s}", "", "")' for s in seconds]
    return Query(window=None, text=union(terms), xid_counts=True)


def events(series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally | None = None) -> XidEvents:
    """The query's answer (malformed identifiers dropped; a code or count that is not a whole
    non-negative number ignored)."""
    out: XidEvents = {}
    for labels, value in series:
        key = (labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
        if not valid_key(*key):
            if drops is not None:
                drops.add(DropReason.INVALID_ID)
            continue
        code, within = labels.get(XID_LABEL, ""), labels.get(WITHIN_LABEL, "")
        if not (code.isdigit() and within.isdigit()) or not math.isfinite(value) or value < 0:
            continue
        out.setdefault(key, {}).setdefault(int(within), {})[int(code)] = round(value)
    return out
