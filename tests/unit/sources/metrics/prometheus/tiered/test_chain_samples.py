"""The activity chain (and a restart's whole window) read as raw samples: the queries (size, each
UUID once, the names and window, the whole window's buckets) and the rows made of the answer
(Prometheus' rules for each aggregate, Kahan sums, NaN, units, ``old or new``, several targets, MIG
keys, malformed and partial answers)."""

from __future__ import annotations

import json
import math
import re
import statistics
import uuid as uuidlib
from typing import Any

import pytest

from gpu_efficiency.config import DEFAULT_MATCHERS
from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus.aggregate_rows import FIELDS
from gpu_efficiency.sources.metrics.prometheus.promql import MAX_QUERY_BYTES, QUERY_PLAN
from gpu_efficiency.sources.metrics.prometheus.tiered.chain_samples import (
    CHAIN_PLAN,
    NAMES,
    WHOLE_BUCKETS,
    WHOLE_NAMES,
    WHOLE_PLAN,
    chain_sample_queries,
    decode_matrix,
    fold_chain_samples,
    fold_whole_samples,
    raw_fits,
    series_aggregates,
    whole_sample_queries,
)
from gpu_efficiency.sources.metrics.prometheus.vector import PARTIAL

NOW = 1_700_000_000.0
U = "GPU-11111111-2222-3333-4444-555555555555"


def _series(name: str, values: list[Any], uuid: str = U, **labels: str) -> dict[str, Any]:
    """One raw series: ``values`` 15 s apart, the newest at NOW (a value may be a string: as sent)."""
    times = [NOW - 15 * (len(values) - 1 - i) for i in range(len(values))]
    return {
        "metric": {"__name__": name, "UUID": uuid, "Hostname": "n1", **labels},
        "values": [
            [t, v if isinstance(v, str) else repr(float(v))] for t, v in zip(times, values, strict=True)
        ],
    }


def _get(rows: dict[Signal, list[float]], signal: Signal, agg: str) -> float:
    return rows[signal][FIELDS.index(agg)]


def _uuids(n: int) -> list[str]:
    return [f"GPU-{uuidlib.UUID(int=i * 7919 + 13)}" for i in range(n)]


@pytest.mark.parametrize("count", [1, 2, 20, 350, 809, 8000])
def test_queries_fit_the_limit_and_list_every_uuid_once(count: int) -> None:
    uuids = _uuids(count)
    queries = chain_sample_queries(uuids, 120, DEFAULT_MATCHERS)
    assert queries is not None
    listed: list[str] = []
    for query in queries:
        assert len(query.text.encode()) <= MAX_QUERY_BYTES
        assert query.samples
        assert query.window is Window.ACTIVITY
        assert query.text.endswith("}[120s]")
        (names,) = re.findall(r'__name__=~"([^"]+)"', query.text)
        assert {n for n in NAMES if re.fullmatch(names, n)} == set(NAMES)  # the chain's names, all
        assert DEFAULT_MATCHERS in query.text
        (pattern,) = re.findall(r'UUID=~"([^"]+)"', query.text)
        listed += pattern.replace("\\\\", "\\").split("|")
    assert sorted(listed) == sorted(uuids)  # each once: no GPU asked twice, none left out
    if count >= 350:  # ~350 a query, where the aggregated chain lists ~20
        assert len(queries) <= math.ceil(count / 300)


def test_no_uuid_no_query_and_matchers_too_long_none() -> None:
    assert chain_sample_queries([], 120, DEFAULT_MATCHERS) == []
    assert chain_sample_queries(_uuids(1), 120, 'x="' + "y" * MAX_QUERY_BYTES + '"') is None


def test_aggregates_follow_prometheus_rules() -> None:
    values = [10.0, 20.0, 60.0, 30.0]
    rows = fold_chain_samples([_series("DCGM_FI_DEV_GPU_UTIL", values)])[(U, "")]
    assert set(rows) == {Signal.GPU_UTIL}
    assert _get(rows, Signal.GPU_UTIL, "max") == 60.0
    assert _get(rows, Signal.GPU_UTIL, "avg") == pytest.approx(30.0)
    assert _get(rows, Signal.GPU_UTIL, "count") == 4.0
    assert _get(rows, Signal.GPU_UTIL, "ts") == NOW
    assert _get(rows, Signal.GPU_UTIL, "stddev") == pytest.approx(statistics.pstdev(values))
    assert math.isnan(_get(rows, Signal.GPU_UTIL, "min"))  # not asked of the chain: not returned
    sm = fold_chain_samples([_series("DCGM_FI_PROF_SM_ACTIVE", [0.5])])[(U, "")]
    assert math.isnan(_get(sm, Signal.SM_ACTIVE, "stddev"))  # the plan asks no stddev of SM_ACTIVE
    assert _get(sm, Signal.SM_ACTIVE, "max") == 0.5


def test_nan_is_ignored_by_max_and_taken_in_by_avg_and_stddev() -> None:
    rows = fold_chain_samples([_series("DCGM_FI_DEV_GPU_UTIL", ["NaN", 5.0, "NaN", 3.0])])[(U, "")]
    assert _get(rows, Signal.GPU_UTIL, "max") == 5.0
    assert math.isnan(_get(rows, Signal.GPU_UTIL, "avg"))
    assert math.isnan(_get(rows, Signal.GPU_UTIL, "stddev"))
    assert _get(rows, Signal.GPU_UTIL, "count") == 4.0
    every = fold_chain_samples([_series("DCGM_FI_DEV_GPU_UTIL", ["NaN", "NaN"])])[(U, "")]
    assert math.isnan(_get(every, Signal.GPU_UTIL, "max"))


def test_a_ratio_family_is_scaled_to_percent_but_not_its_count_or_time() -> None:
    rows = fold_chain_samples([_series("DCGM_FI_DEV_GPU_UTIL_RATIO", [0.1, 0.3])])[(U, "")]
    assert _get(rows, Signal.GPU_UTIL, "max") == pytest.approx(30.0)
    assert _get(rows, Signal.GPU_UTIL, "avg") == pytest.approx(20.0)
    assert _get(rows, Signal.GPU_UTIL, "stddev") == pytest.approx(10.0)
    assert _get(rows, Signal.GPU_UTIL, "count") == 2.0
    assert _get(rows, Signal.GPU_UTIL, "ts") == NOW
    renamed = fold_chain_samples([_series("DCGM_FI_PROF_SM_UTIL_RATIO", [0.25])])[(U, "")]
    assert _get(renamed, Signal.SM_ACTIVE, "max") == 0.25  # same unit under both names: as is


def test_old_or_new_reads_the_old_name_where_both_share_labels_and_both_across_targets() -> None:
    old = _series("DCGM_FI_DEV_GPU_UTIL", [5.0], instance="a:9400")
    same_target = _series("DCGM_FI_DEV_GPU_UTIL_RATIO", [0.9], instance="a:9400")
    other_target = _series("DCGM_FI_DEV_GPU_UTIL_RATIO", [0.9], instance="b:9400")
    assert _get(fold_chain_samples([same_target, old])[(U, "")], Signal.GPU_UTIL, "max") == 5.0
    both = fold_chain_samples([old, other_target])[(U, "")]
    assert _get(both, Signal.GPU_UTIL, "max") == pytest.approx(90.0)  # max by (UUID, GPU_I_ID)


def test_series_of_one_gpu_combine_with_max_per_aggregate() -> None:
    a = _series("DCGM_FI_PROF_SM_ACTIVE", [0.2, 0.2, 0.2], instance="a:9400")
    b = _series("DCGM_FI_PROF_SM_ACTIVE", [0.1, 0.4], instance="b:9400")
    b["values"][-1][0] = NOW - 5  # b's newest sample is older
    rows = fold_chain_samples([a, b])[(U, "")]
    assert _get(rows, Signal.SM_ACTIVE, "max") == pytest.approx(0.4)
    assert _get(rows, Signal.SM_ACTIVE, "avg") == pytest.approx(0.25)  # b's avg, the larger
    assert _get(rows, Signal.SM_ACTIVE, "count") == 3.0
    assert _get(rows, Signal.SM_ACTIVE, "ts") == NOW


def test_mig_instances_are_keys_of_their_own_and_strangers_are_ignored() -> None:
    series = [
        _series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [0.3], GPU_I_ID="1"),
        _series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [0.7], GPU_I_ID="2"),
        _series("DCGM_FI_DEV_FB_USED", [100.0]),  # not a chain name
        {"metric": {"__name__": "DCGM_FI_PROF_SM_ACTIVE"}, "values": [[NOW, "1"]]},  # no UUID
        _series("DCGM_FI_PROF_SM_ACTIVE", []),  # no sample in the window
    ]
    rows = fold_chain_samples(series)
    assert set(rows) == {(U, "1"), (U, "2")}
    assert _get(rows[(U, "2")], Signal.GR_ENGINE_ACTIVE, "max") == 0.7


def _body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_the_answer_must_be_a_complete_successful_matrix_within_the_cap() -> None:
    matrix = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [_series("DCGM_FI_DEV_GPU_UTIL", [1])]},
    }
    assert len(decode_matrix(_body(matrix))) == 1
    with pytest.raises(SourceUnavailable, match="more than 2 series"):
        decode_matrix(
            _body({**matrix, "data": {**matrix["data"], "result": [matrix["data"]["result"][0]] * 3}}), 2
        )
    with pytest.raises(SourceUnavailable, match=re.escape(PARTIAL)):
        decode_matrix(_body({**matrix, "isPartial": True}))
    with pytest.raises(SourceUnavailable, match="expected a matrix"):
        decode_matrix(_body({"status": "success", "data": {"resultType": "vector", "result": []}}))
    with pytest.raises(SourceUnavailable, match="query failed: bad"):
        decode_matrix(_body({"status": "error", "error": "bad"}))
    with pytest.raises(SourceUnavailable, match="invalid JSON"):
        decode_matrix(b"{")


@pytest.mark.parametrize(
    "item",
    [
        {"metric": ["UUID", U], "values": []},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": [U]}, "values": [[NOW, "1"]]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": U}, "values": [[NOW]]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": U}, "values": [["later", "1"]]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": U}, "values": 5},
    ],
)
def test_a_malformed_series_is_source_unavailable(item: dict[str, Any]) -> None:
    with pytest.raises(SourceUnavailable):
        fold_chain_samples([item])


def test_a_value_that_is_no_number_reads_nan_as_prometheus_would_not_send() -> None:
    rows = fold_chain_samples([_series("DCGM_FI_DEV_GPU_UTIL", ["busy", 4.0])])[(U, "")]
    assert _get(rows, Signal.GPU_UTIL, "max") == 4.0
    assert math.isnan(_get(rows, Signal.GPU_UTIL, "avg"))


@pytest.mark.parametrize(
    ("names", "plan", "fold"),
    [(NAMES, CHAIN_PLAN, fold_chain_samples), (WHOLE_NAMES, WHOLE_PLAN, fold_whole_samples)],
    ids=["chain", "whole window"],
)
def test_every_signal_has_every_aggregate_the_plan_asks(names: Any, plan: Any, fold: Any) -> None:
    series = [_series(name, [0.5, 0.25]) for name, (_, place, _, _) in names.items() if place == 0]
    rows = fold(series)[(U, "")]
    assert set(rows) == set(plan)
    for signal, aggs in plan.items():
        for agg in aggs:
            assert not math.isnan(_get(rows, signal, agg)), (signal, agg)
        for agg in set(FIELDS) - set(aggs):
            assert math.isnan(_get(rows, signal, agg)), (signal, agg)  # not asked: not measured


def test_the_whole_window_is_the_activity_plan_and_the_chain_a_part_of_it() -> None:
    assert QUERY_PLAN[Window.ACTIVITY] == WHOLE_PLAN
    assert set(NAMES) < set(WHOLE_NAMES)
    assert all(WHOLE_NAMES[name] == found for name, found in NAMES.items())


def test_min_and_last_follow_prometheus_rules() -> None:
    rows = fold_whole_samples([_series("DCGM_FI_DEV_FB_USED", ["NaN", 7.0, 3.0, "NaN", 5.0])])[(U, "")]
    assert _get(rows, Signal.FB_USED, "min") == 3.0  # NaN ignored unless every value is
    assert _get(rows, Signal.FB_USED, "last") == 5.0
    assert math.isnan(
        _get(
            fold_whole_samples([_series("DCGM_FI_DEV_FB_USED", [1.0, "NaN"])])[(U, "")],
            Signal.FB_USED,
            "last",
        )
    )
    every = fold_whole_samples([_series("DCGM_FI_DEV_FB_USED", ["NaN", "NaN"])])[(U, "")]
    assert math.isnan(_get(every, Signal.FB_USED, "min"))
    unordered = _series("DCGM_FI_DEV_FB_FREE", [1.0, 2.0, 3.0])
    unordered["values"].reverse()  # the newest sample first: last is still the newest's value
    assert _get(fold_whole_samples([unordered])[(U, "")], Signal.FB_FREE, "last") == 3.0
    ratio = fold_whole_samples([_series("DCGM_FI_DEV_GPU_UTIL_RATIO", [0.2, 0.1])])[(U, "")]
    assert _get(ratio, Signal.GPU_UTIL, "max") == pytest.approx(20.0)  # min and last are scaled too
    assert math.isnan(_get(ratio, Signal.GPU_UTIL, "min"))  # (GPU_UTIL's plan asks neither)


def test_avg_and_stddev_add_as_prometheus_does_to_the_last_bit() -> None:
    """Kahan-Neumaier sums (Prometheus 3's ``kahansum.Inc``): a plain sum loses the small terms
    beside 1e16 and reads 0.25; an overflowing sum switches to the incremental mean."""
    assert series_aggregates([[NOW + i, str(v)] for i, v in enumerate([1e16, 1.0, -1e16, 1.0])])["avg"] == 0.5
    assert series_aggregates([[NOW, "1e308"], [NOW + 1, "1e308"]])["avg"] == 1e308
    assert series_aggregates([[NOW + i, "0.1"] for i in range(8)])["stddev"] == 0.0
    values = [0.1, 0.7, 0.2, 0.9, 0.4]
    found = series_aggregates([[NOW + i, repr(v)] for i, v in enumerate(values)])
    assert found["stddev"] == pytest.approx(statistics.pstdev(values), rel=1e-15)
    assert found["avg"] == pytest.approx(statistics.fmean(values), rel=1e-15)
    assert math.isnan(series_aggregates([[NOW, "1"]], spread=False)["stddev"])  # not asked


def _endings(n: int) -> list[str]:
    """UUIDs ending in every hex digit, in both cases, and in characters no bucket names."""
    return [*_uuids(n), "GPU-ABCDEF", "GPU-x", "GPU-", "GPU-7.", "GPU-\u00e9", "1"]


@pytest.mark.parametrize("matchers", ["", DEFAULT_MATCHERS, DEFAULT_MATCHERS + ',namespace="gpu-operator"'])
def test_the_whole_window_buckets_select_every_uuid_once_and_fit(matchers: str) -> None:
    queries = whole_sample_queries(120, matchers)
    assert queries is not None
    assert len(queries) == len(WHOLE_BUCKETS) + 1
    counts = dict.fromkeys(_endings(300), 0)
    for query in queries:
        assert query.samples
        assert query.whole
        assert query.window is Window.ACTIVITY
        assert len(query.text.encode()) <= MAX_QUERY_BYTES
        assert query.text.endswith("[120s]")
        assert matchers in query.text
        op, pattern = re.findall(r'UUID(=~|!~)"([^"]*)"', query.text)[0]
        regex = re.compile(pattern)
        for uuid in counts:
            counts[uuid] += bool(regex.fullmatch(uuid)) is (op == "=~")
        named = re.findall(r'__name__=~"([^"]*)"', query.text)[0]
        assert {name for name in WHOLE_NAMES if re.fullmatch(named, name)} == set(WHOLE_NAMES)
    assert set(counts.values()) == {1}
    assert whole_sample_queries(120, 'x="' + "y" * MAX_QUERY_BYTES + '"') is None


@pytest.mark.parametrize(
    ("seconds", "scrape", "fits"),
    [(120, 1.0, True), (121, 1.0, False), (1800, 15.0, True), (3600, 15.0, False), (120, 0.0, False)],
)
def test_raw_samples_only_while_a_series_holds_at_most_120(seconds: float, scrape: float, fits: bool) -> None:
    assert raw_fits(seconds, scrape) is fits
