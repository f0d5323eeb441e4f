"""Streamed decoding of large responses, and the two-round fetch of filtered fault windows."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from tests.unit.sources.metrics.fake_http import form, json_answer

from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.base import FaultHints, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource, decode_vector
from gpu_efficiency.sources.metrics.prometheus.promql import (
    AGG_LABEL,
    CANDIDATE_LABEL,
    MAX_LISTED_GPUS,
    WINDOW_PARTS,
    candidates_query,
    cycle_queries,
    restricted_queries,
    union,
)
from gpu_efficiency.sources.metrics.prometheus.vector import iter_vector
from gpu_efficiency.sources.metrics.prometheus.windows import fold_window

WINDOWS = {Window.ACTIVITY: 600.0, Window.FAULT: 120.0, Window.THERMAL_HOLD: 120.0}
HINTS = FaultHints(gpu_temperature_above=90, memory_temperature_above=95)


def _body(series: list[tuple[dict[str, str], str]], trailer: str = "") -> bytes:
    result = [{"metric": m, "value": [1700000000.0, v]} for m, v in series]
    doc = json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}, separators=(",", ":")
    )
    return (doc[:-1] + trailer + "}").encode()


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


SERIES = [
    ({"UUID": f"GPU-{i}", AGG_LABEL: "SM_ACTIVE:max", "odd": 'x},{"metric":{"y\\'}, f"0.{i}")
    for i in range(300)
] + [({"UUID": "GPU-x", AGG_LABEL: "SM_ACTIVE:avg"}, "NaN")]


@pytest.mark.parametrize("piece", [1, 7, 64, 4096])
@pytest.mark.parametrize("chunk_bytes", [1, 50, 1000, 1 << 20])
@pytest.mark.parametrize("trailer", ["", ',"warnings":["a ]} b","},{\\"metric\\":"]'])
def test_streamed_vector_equals_whole_decode(piece: int, chunk_bytes: int, trailer: str) -> None:
    body = _body(SERIES, trailer)
    streamed = [
        (item["metric"], float(item["value"][1]))
        for items in iter_vector(_pieces(body, piece), chunk_bytes)
        for item in items
    ]
    whole = decode_vector(body)
    assert [m for m, _ in streamed] == [m for m, _ in whole]
    assert [repr(v) for _, v in streamed] == [repr(v) for _, v in whole]


def test_streamed_empty_error_and_garbage() -> None:
    assert [i for items in iter_vector(_pieces(_body([]), 3), 1) for i in items] == []
    error = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()
    with pytest.raises(SourceUnavailable, match="parse error"):
        list(iter_vector(_pieces(error, 5), 1))
    with pytest.raises(SourceUnavailable, match="invalid JSON"):
        list(iter_vector([b"<html>"], 1))
    truncated = _body(SERIES)[:-40]
    with pytest.raises(SourceUnavailable):
        list(iter_vector(_pieces(truncated, 100), 100))


def test_fold_window_keeps_nan_and_groups_by_gpu() -> None:
    values = fold_window(iter_vector([_body(SERIES)], 1000))
    assert values[("GPU-3", "")][Signal.SM_ACTIVE][1] == pytest.approx(0.3)  # "max" is field 1
    assert str(values[("GPU-x", "")][Signal.SM_ACTIVE][0]) == "nan"


def test_union_is_balanced_and_complete() -> None:
    terms = [f"t{i}" for i in range(7)]
    text = union(terms)
    assert all(t in text for t in terms)
    assert text.count(" or ") == 6
    assert union(["a"]) == "a"
    assert union(["a", "b"]) == "a or b"


def test_restricted_query_lists_uuids_in_every_selector() -> None:
    unrestricted = {q.window: q.text for q in cycle_queries(WINDOWS, hints=HINTS)}[Window.FAULT]
    keys = [("GPU-b", ""), ("GPU-a.1", "3")]
    parts = restricted_queries(Window.FAULT, 120.0, HINTS, keys)
    assert len(parts) == WINDOW_PARTS[Window.FAULT]
    plain = {q.window: q.text for q in cycle_queries(WINDOWS)}[Window.FAULT]  # the terms, unfiltered
    selectors = plain.count("DCGM_FI_") + plain.count("DCGM_EXP_")
    assert sum(q.text.count('UUID=~"GPU-a\\\\.1|GPU-b"') for q in parts) == selectors
    assert all(q.keys == frozenset(keys) for q in parts)  # the filter still applies, to the answer's keys
    many = restricted_queries(
        Window.FAULT, 120.0, HINTS, [(f"GPU-{i}", "") for i in range(MAX_LISTED_GPUS + 1)]
    )
    assert len(many) == len(parts)  # too many to list: each part over every GPU, with the filter
    assert all(q.keys is None for q in many)
    filtered = unrestricted[unrestricted.index(") and on (UUID, GPU_I_ID) (") :]
    assert all(q.text.endswith(filtered) for q in many)


def test_candidates_query_covers_filtered_windows_only() -> None:
    query = candidates_query({**WINDOWS, Window.THERMAL_RECOVERY: 300.0}, HINTS)
    assert query is not None
    assert query.candidates
    assert query.window is None
    assert f'"{CANDIDATE_LABEL}", "fault"' in query.text
    assert f'"{CANDIDATE_LABEL}", "thermal-hold"' in query.text
    assert "thermal-recovery" not in query.text  # no held node: nothing can recover
    held = candidates_query({Window.THERMAL_RECOVERY: 300.0}, FaultHints(held_nodes=frozenset({"n1"})))
    assert held is not None
    assert '"thermal-recovery"' in held.text
    assert candidates_query({Window.ACTIVITY: 600.0}, HINTS) is None


def _prometheus(queries: list[str], request: httpx.Request) -> httpx.Response:
    """Names GPU-2 as a fault-window candidate and answers the restricted fault window for it."""
    query = form(request)["query"][0]
    queries.append(query)
    if query.startswith("group by (UUID"):
        series = [
            ({"UUID": u, "gpu": str(i), "Hostname": "n1"}, "1") for i, u in enumerate(["GPU-1", "GPU-2"])
        ]
    elif CANDIDATE_LABEL in query:
        series = [({"UUID": "GPU-2", CANDIDATE_LABEL: "fault"}, "1")]
    elif "ECC_DBE_VOLATILE" in query:  # GPU-1 is no candidate: its series are not kept
        series = [({"UUID": u, AGG_LABEL: "ECC_DBE_VOLATILE:max"}, "3") for u in ("GPU-2", "GPU-1")]
    elif "PCIE_LINK_GEN:max" in query:  # another part of the fault window
        series = [({"UUID": "GPU-2", AGG_LABEL: "PCIE_LINK_GEN:max"}, "4")]
    elif "SM_ACTIVE" in query:
        series = [({"UUID": u, AGG_LABEL: "SM_ACTIVE:max"}, "0.5") for u in ("GPU-1", "GPU-2")]
    else:
        series = []
    return json_answer(_body(series))


def test_fetch_with_hints_asks_candidates_then_their_windows() -> None:
    sent: list[str] = []
    transport = httpx.MockTransport(lambda request: _prometheus(sent, request))
    source = PrometheusSource(PrometheusConfig(url="http://prometheus.test"), transport=transport)
    result = source.fetch(FetchRequest(now=1700000000.0, windows=WINDOWS, scrape_interval=15.0, hints=HINTS))
    parts = WINDOW_PARTS[Window.FAULT]
    assert parts > 1
    # identity, inventory, activity, candidates, GPU-2's fault window in its parts
    assert result.queries == len(sent) == 4 + parts
    fault = [q for q in sent if 'UUID=~"GPU-2"' in q]
    assert len(fault) == parts
    assert all("and on" not in q for q in fault)  # the filter is applied to the answer instead
    by_uuid = {g.uuid: g for g in result.gpus}
    dbe = by_uuid["GPU-2"].get(Window.FAULT, Signal.ECC_DBE_VOLATILE)
    assert dbe is not None
    assert dbe.max == 3
    gen = by_uuid["GPU-2"].get(Window.FAULT, Signal.PCIE_LINK_GEN)  # parts' answers merged
    assert gen is not None
    assert gen.max == 4
    assert Window.FAULT not in by_uuid["GPU-1"].stats  # not a candidate: never fetched
    sm = by_uuid["GPU-1"].get(Window.ACTIVITY, Signal.SM_ACTIVE)
    assert sm is not None
    assert sm.max == 0.5
