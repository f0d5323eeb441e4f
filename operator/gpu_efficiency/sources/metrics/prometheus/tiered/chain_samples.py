"""The activity chain of listed GPUs read as raw samples and aggregated here, not by Prometheus.

Each cycle the tiered fetch needs the chain (SM_ACTIVE, GR_ENGINE_ACTIVE, GPU_UTIL: max, avg,
count, newest time, and GPU_UTIL's stddev) of every idle candidate. As server-side aggregates
(``promql.listed_window_queries``) each listed UUID is repeated in all 16 selectors, so a 16 KiB
query lists ~20 GPUs: 42 queries for 809 idle GPUs at 1,000 nodes, each re-reading the same samples
once per aggregate. One plain range selector over the chain's metric names lists each UUID once
(~350 GPUs a query) and reads every sample once: for 1,020 idle GPUs, 4 queries and 0.05 s of
Prometheus CPU instead of 53 and 0.26 s (bench/scale/RESULTS.md). Any PromQL store answers it: an
instant query of a range selector is the Prometheus HTTP API's raw-sample read. Only while a series
holds at most ``MAX_RAW_SAMPLES`` samples in the window: a raw answer grows with them.

The aggregates follow Prometheus' rules, so a row is what ``window_query`` would have returned:
``max_over_time`` and ``max by`` ignore NaN unless every value is NaN; ``avg_over_time`` and
``stddev_over_time`` (population) take NaN in; ``count_over_time`` counts every sample; a name
family in another unit is scaled (``promql.over``: GPU_UTIL_RATIO x 100) and, as ``old or new``,
read only where the old name has no series with the same labels; the series of one GPU key
(several scrape targets) are combined with ``max``. The newest time is the newest sample in the
window, where ``timestamp()`` would also see one up to Prometheus' 5-minute lookback before it: a
chain signal with no sample in the window has no row either way, so its GPU is judged on missing
data all the same.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpu_efficiency.engine import ACTIVITY_CHAIN
from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus.aggregate_rows import FIELDS, WIDTH
from gpu_efficiency.sources.metrics.prometheus.promql import (
    MAX_QUERY_BYTES,
    QUERY_PLAN,
    Query,
    name_regex,
    served_names,
)
from gpu_efficiency.sources.metrics.prometheus.regex_lists import chunk_alternatives, uuid_alternatives
from gpu_efficiency.sources.metrics.prometheus.vector import check_cap, decode_result
from gpu_efficiency.sources.metrics.prometheus.windows import WindowValues

NAN = math.nan

#: The chain's signals and the aggregates the activity window asks of each.
CHAIN_PLAN: Mapping[Signal, tuple[str, ...]] = {
    signal: QUERY_PLAN[Window.ACTIVITY][signal] for signal, _, _ in ACTIVITY_CHAIN
}
#: The aggregates computed here; a plan asking for another fails at import, not in a cycle.
COMPUTED = ("max", "avg", "count", "ts", "stddev")
if not {agg for aggs in CHAIN_PLAN.values() for agg in aggs} <= set(COMPUTED):
    raise ValueError(f"chain_samples computes only {COMPUTED}: the activity plan asks for more")

#: Metric name -> (signal, its name family's place in ``served_names``: 0 is read first, factor).
NAMES: Mapping[str, tuple[Signal, int, float]] = {
    name: (signal, place, factor)
    for signal in CHAIN_PLAN
    for place, (factor, names) in enumerate(served_names(signal))
    for name in names
}
#: The aggregates scaled by a family's factor (count and times are not).
_SCALED = frozenset({"max", "avg", "stddev"})
#: Raw samples are read only while a series holds at most this many in the window (30 min at a
#: 15 s scrape): a query's answer then stays under ~4 MB (350 GPUs x 3 signals x 120 samples),
#: where a 24 h window would bring ~150 MB read whole. A longer window (or a faster scrape) has
#: its chain aggregated by Prometheus, whose answer does not grow with the samples.
MAX_RAW_SAMPLES = 120


def raw_fits(seconds: float, scrape_interval: float) -> bool:
    """Is the chain over ``seconds`` at ``scrape_interval`` short enough to read as raw samples?"""
    return scrape_interval > 0 and seconds / scrape_interval <= MAX_RAW_SAMPLES


def chain_sample_queries(
    uuids: Collection[str], seconds: float, matchers: str, limit: int = MAX_QUERY_BYTES
) -> list[Query] | None:
    """The chain's raw samples over the last ``seconds`` for these UUIDs, each query under
    ``limit`` bytes; None when one UUID alone does not fit (matchers too long)."""
    if not uuids:
        return []
    head = '{__name__=~"' + name_regex(list(NAMES)) + '"' + (f",{matchers}" if matchers else "") + ',UUID=~"'
    tail = f'"}}[{max(1, round(seconds))}s]'
    room = limit - len(head.encode()) - len(tail.encode())
    patterns = chunk_alternatives(uuid_alternatives(uuids), ("", ""), 1, room)
    if patterns is None:
        return None
    return [Query(window=Window.ACTIVITY, text=head + pattern + tail, samples=True) for pattern in patterns]


def decode_matrix(body: bytes, max_series: int = 0) -> list[Any]:
    """The series of a range-selector answer (``{"metric": ..., "values": [[t, "v"], ...]}``);
    SourceUnavailable on an error, a partial answer, anything but a matrix, or past ``max_series``."""
    result = decode_result(body, "matrix")
    check_cap(len(result), max_series)
    return result


def series_aggregates(values: Sequence[Sequence[Any]]) -> dict[str, float] | None:
    """One series' aggregates by Prometheus' rules (None: no sample); SourceUnavailable when a
    sample is not a [time, "value"] pair with a numeric time."""
    floats: list[float] = []
    newest = -math.inf
    try:
        for stamp, text in values:
            when = float(stamp)
            if math.isnan(when):
                raise ValueError("NaN time")
            newest = max(newest, when)
            try:
                floats.append(float(text))
            except (TypeError, ValueError):
                floats.append(NAN)
    except (TypeError, ValueError) as exc:
        raise SourceUnavailable(f"Prometheus returned a malformed sample: {exc}") from exc
    if not floats:
        return None
    peak = floats[0]
    mean = spread = 0.0
    for count, value in enumerate(floats, 1):
        if value > peak or math.isnan(peak):
            peak = value
        delta = value - mean  # Welford, as stddev_over_time
        mean += delta / count
        spread += delta * (value - mean)
    return {
        "max": peak,
        "avg": sum(floats) / len(floats),
        "count": float(len(floats)),
        "ts": newest,
        "stddev": math.sqrt(spread / len(floats)) if math.isfinite(spread) else NAN,
    }


def _max(old: float, new: float) -> float:
    """PromQL's ``max``: NaN only when every value is."""
    return new if new > old or math.isnan(old) else old


def fold_chain_samples(series: Sequence[Any]) -> WindowValues:
    """Raw chain series as the rows ``fold_window`` makes of the aggregated chain query."""
    parsed: list[
        tuple[int, Signal, float, tuple[str, str], frozenset[tuple[str, str]], dict[str, float]]
    ] = []
    try:
        for item in series:
            labels = item.get("metric") or {}
            found = NAMES.get(labels.get("__name__", ""))
            uuid = labels.get("UUID")
            if found is None or not uuid:
                continue
            gpu_i = labels.get("GPU_I_ID", "")
            if type(uuid) is not str or type(gpu_i) is not str:
                raise TypeError(f"GPU labels {uuid!r}/{gpu_i!r} are not strings")
            aggregates = series_aggregates(item.get("values") or ())
            if aggregates is None:
                continue
            signal, place, factor = found
            same = frozenset((k, v) for k, v in labels.items() if k != "__name__")
            parsed.append((place, signal, factor, (uuid, gpu_i), same, aggregates))
    except (AttributeError, TypeError) as exc:
        raise SourceUnavailable(f"Prometheus returned a malformed series: {exc}") from exc
    parsed.sort(key=lambda entry: entry[0])  # the old family first: ``old or new``
    first: dict[Signal, set[frozenset[tuple[str, str]]]] = {}
    out: WindowValues = {}
    for place, signal, factor, key, same, aggregates in parsed:
        if place == 0:
            first.setdefault(signal, set()).add(same)
        elif same in first.get(signal, ()):
            continue
        row = out.setdefault(key, {}).setdefault(signal, [NAN] * WIDTH)
        for agg in CHAIN_PLAN[signal]:
            value = aggregates[agg] * factor if agg in _SCALED and factor != 1.0 else aggregates[agg]
            index = FIELDS.index(agg)
            row[index] = _max(row[index], value)
    return out
