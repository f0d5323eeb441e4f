"""The activity window read as raw samples and aggregated here, not by Prometheus: the chain of
listed GPUs each cycle, and the whole window of every GPU when the activity cache starts empty.

Each cycle the tiered fetch needs the chain (SM_ACTIVE, GR_ENGINE_ACTIVE, GPU_UTIL: max, avg,
count, newest time, and GPU_UTIL's stddev) of every idle candidate. As server-side aggregates
(``promql.listed_window_queries``) each listed UUID is repeated in all 16 selectors, so a 16 KiB
query lists ~20 GPUs: 42 queries for 809 idle GPUs at 1,000 nodes, each re-reading the same samples
once per aggregate. One plain range selector over the chain's metric names lists each UUID once
(~350 GPUs a query) and reads every sample once: for 1,020 idle GPUs, 4 queries and 0.05 s of
Prometheus CPU instead of 53 and 0.26 s (bench/scale/RESULTS.md). Any PromQL store answers it: an
instant query of a range selector is the Prometheus HTTP API's raw-sample read. Only while a series
holds at most ``MAX_RAW_SAMPLES`` samples in the window: a raw answer grows with them.

The whole window of every GPU (a restart's first cycle: the cache is empty) is read the same way,
in ``WHOLE_BUCKETS`` queries by the UUID's last character: its 71 aggregates each select every GPU's
series again, where one range selector per bucket reads each sample once. At 1,000 nodes x 8 GPUs,
Prometheus 3.10 spent 3.5 s on the raw read against 14.2 s on the aggregates, and the rows folded
here were the same (bench/scale/RESULTS.md, "A restart's whole window as raw samples").

The aggregates follow Prometheus' rules, so a row is what ``window_query`` would have returned:
``max_over_time``, ``min_over_time`` and ``max by`` ignore NaN unless every value is NaN;
``avg_over_time`` and ``stddev_over_time`` (population) take NaN in and are computed as Prometheus 3
does, with Kahan sums, so they agree to the last bit (VictoriaMetrics sums plainly: within ~1e-15);
``last_over_time`` is the newest sample's value; ``count_over_time`` counts every sample; a name
family in another unit is scaled (``promql.over``: GPU_UTIL_RATIO x 100) and, as ``old or new``,
read only where the old name has no series with the same labels; the series of one GPU key
(several scrape targets) are combined with ``max``. The newest time is the newest sample in the
window, where ``timestamp()`` would also see one up to Prometheus' 5-minute lookback before it: a
signal with no sample in the window has no count either way, so its GPU is judged on missing data
all the same (and reads less fresh, never more).
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
#: The whole activity window's signals and aggregates (a restart's first cycle).
WHOLE_PLAN: Mapping[Signal, tuple[str, ...]] = QUERY_PLAN[Window.ACTIVITY]
#: The aggregates computed here; a plan asking for another fails at import, not in a cycle.
COMPUTED = ("max", "avg", "min", "last", "count", "ts", "stddev")
if not {agg for aggs in WHOLE_PLAN.values() for agg in aggs} <= set(COMPUTED):
    raise ValueError(f"chain_samples computes only {COMPUTED}: the activity plan asks for more")

#: Metric name -> (signal, its name family's place in ``served_names``: 0 is read first, factor,
#: whether the signal has a second family: only then must ``old or new`` compare label sets).
Names = Mapping[str, tuple[Signal, int, float, bool]]


def _names(plan: Mapping[Signal, tuple[str, ...]]) -> Names:
    return {
        name: (signal, place, factor, len(served_names(signal)) > 1)
        for signal in plan
        for place, (factor, names) in enumerate(served_names(signal))
        for name in names
    }


NAMES = _names(CHAIN_PLAN)
WHOLE_NAMES = _names(WHOLE_PLAN)
#: The aggregates scaled by a family's factor (count and times are not).
_SCALED = frozenset({"max", "avg", "min", "last", "stddev"})
#: Where each computed aggregate goes in a row.
_INDEX = {agg: FIELDS.index(agg) for agg in COMPUTED}
#: A restart's whole window of every GPU is read in one query per UUID ending (hex; one more takes
#: any other ending): each answer ~1/16 of ~80 MB at 8,000 GPUs, and ``WHOLE_IN_FLIGHT`` at a time.
WHOLE_BUCKETS = (*"0123456789", "[aA]", "[bB]", "[cC]", "[dD]", "[eE]", "[fF]")
#: Whole-window buckets asked for at once: Prometheus reads the next while the operator folds one,
#: and the operator holds two answers, not seventeen (peak RSS; bench/scale/RESULTS.md).
WHOLE_IN_FLIGHT = 2
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


def whole_sample_queries(seconds: float, matchers: str, limit: int = MAX_QUERY_BYTES) -> list[Query] | None:
    """The whole activity window of every GPU as raw samples over the last ``seconds``, in one query
    per ``WHOLE_BUCKETS`` ending and one for every other UUID (together: every series with a UUID);
    None when they do not fit ``limit`` bytes (matchers too long)."""
    head = '{__name__=~"' + name_regex(list(WHOLE_NAMES)) + '"' + (f",{matchers}" if matchers else "")
    tail = f"}}[{max(1, round(seconds))}s]"
    buckets = [f',UUID=~".*{ending}"' for ending in WHOLE_BUCKETS]
    buckets.append(',UUID!~".*(' + "|".join(WHOLE_BUCKETS) + ')"')
    texts = [head + bucket + tail for bucket in buckets]
    if any(len(text.encode()) > limit for text in texts):
        return None
    return [Query(window=Window.ACTIVITY, text=text, samples=True, whole=True) for text in texts]


def decode_matrix(body: bytes, max_series: int = 0) -> list[Any]:
    """The series of a range-selector answer (``{"metric": ..., "values": [[t, "v"], ...]}``);
    SourceUnavailable on an error, a partial answer, anything but a matrix, or past ``max_series``."""
    result = decode_result(body, "matrix")
    check_cap(len(result), max_series)
    return result


def _kahan(inc: float, total: float, carry: float) -> tuple[float, float]:
    """Prometheus' ``kahansum.Inc`` (Neumaier's variant): the sum and its carried error."""
    new = total + inc
    if math.isinf(new):
        return new, 0.0
    if abs(total) >= abs(inc):
        return new, carry + ((total - new) + inc)
    return new, carry + ((inc - new) + total)


def _avg(floats: Sequence[float]) -> float:
    """``avg_over_time`` as Prometheus 3 computes it, to the last bit: a Kahan sum divided by the
    count, switching to an incremental mean if the sum overflows."""
    total, carry, mean, incremental = floats[0], 0.0, 0.0, False
    count = 1.0
    for i in range(1, len(floats)):
        value = floats[i]
        count = float(i + 1)
        if not incremental:
            new, new_carry = _kahan(value, total, carry)
            if not math.isinf(new):
                total, carry = new, new_carry
                continue
            incremental = True
            mean = total / (count - 1)
            carry /= count - 1
        q = (count - 1) / count
        mean, carry = _kahan(value / count, q * mean, q * carry)
    return mean + carry if incremental else total / count + carry / count


def _stddev(floats: Sequence[float]) -> float:
    """``stddev_over_time`` as Prometheus 3 computes it (population; Welford with Kahan sums)."""
    count = mean = mean_carry = aux = aux_carry = 0.0
    for value in floats:
        count += 1
        delta = value - (mean + mean_carry)
        mean, mean_carry = _kahan(delta / count, mean, mean_carry)
        aux, aux_carry = _kahan(delta * (value - (mean + mean_carry)), aux, aux_carry)
    variance = (aux + aux_carry) / count
    return math.sqrt(variance) if variance >= 0 else NAN


def series_aggregates(values: Sequence[Sequence[Any]], spread: bool = True) -> dict[str, float] | None:
    """One series' aggregates by Prometheus' rules, to the last bit (None: no sample; ``spread``
    False: no stddev, NaN); SourceUnavailable when a sample is not a [time, "value"] pair with a
    numeric time."""
    floats: list[float] = []
    newest = -math.inf
    last = NAN
    try:
        for stamp, text in values:
            when = float(stamp)
            if math.isnan(when):
                raise ValueError("NaN time")
            try:
                value = float(text)
            except (TypeError, ValueError):
                value = NAN
            floats.append(value)
            if when >= newest:  # last_over_time: the newest sample's value
                newest, last = when, value
    except (TypeError, ValueError) as exc:
        raise SourceUnavailable(f"Prometheus returned a malformed sample: {exc}") from exc
    if not floats:
        return None
    peak = low = floats[0]
    for value in floats:  # max_over_time, min_over_time: NaN only if every value is
        if value > peak or math.isnan(peak):
            peak = value
        if value < low or math.isnan(low):
            low = value
    return {
        "max": peak,
        "avg": _avg(floats),
        "min": low,
        "last": last,
        "count": float(len(floats)),
        "ts": newest,
        "stddev": _stddev(floats) if spread else NAN,
    }


def _max(old: float, new: float) -> float:
    """PromQL's ``max``: NaN only when every value is."""
    return new if new > old or math.isnan(old) else old


def fold_chain_samples(series: Sequence[Any]) -> WindowValues:
    """Raw chain series as the rows ``fold_window`` makes of the aggregated chain query."""
    return fold_samples(series, CHAIN_PLAN, NAMES)


def fold_whole_samples(series: Sequence[Any]) -> WindowValues:
    """Raw series of the whole activity window as the rows ``fold_window`` makes of ``window_query``."""
    return fold_samples(series, WHOLE_PLAN, WHOLE_NAMES)


def fold_samples(series: Sequence[Any], plan: Mapping[Signal, tuple[str, ...]], names: Names) -> WindowValues:
    """Raw series of ``names`` as the rows of ``plan``'s aggregates, per GPU key."""
    parsed: list[
        tuple[int, Signal, float, tuple[str, str], frozenset[tuple[str, str]] | None, dict[str, float]]
    ] = []
    try:
        for item in series:
            labels = item.get("metric") or {}
            found = names.get(labels.get("__name__", ""))
            uuid = labels.get("UUID")
            if found is None or not uuid:
                continue
            gpu_i = labels.get("GPU_I_ID", "")
            if type(uuid) is not str or type(gpu_i) is not str:
                raise TypeError(f"GPU labels {uuid!r}/{gpu_i!r} are not strings")
            signal, place, factor, families = found
            aggregates = series_aggregates(item.get("values") or (), "stddev" in plan[signal])
            if aggregates is None:
                continue
            same = frozenset((k, v) for k, v in labels.items() if k != "__name__") if families else None
            parsed.append((place, signal, factor, (uuid, gpu_i), same, aggregates))
    except (AttributeError, TypeError) as exc:
        raise SourceUnavailable(f"Prometheus returned a malformed series: {exc}") from exc
    parsed.sort(key=lambda entry: entry[0])  # the old family first: ``old or new``
    first: dict[Signal, set[frozenset[tuple[str, str]] | None]] = {}
    out: WindowValues = {}
    for place, signal, factor, key, same, aggregates in parsed:
        if place == 0:
            if same is not None:
                first.setdefault(signal, set()).add(same)
        elif same in first.get(signal, ()):
            continue
        row = out.setdefault(key, {}).setdefault(signal, [NAN] * WIDTH)
        for agg in plan[signal]:
            value = aggregates[agg] * factor if agg in _SCALED and factor != 1.0 else aggregates[agg]
            index = _INDEX[agg]
            row[index] = _max(row[index], value)
    return out
