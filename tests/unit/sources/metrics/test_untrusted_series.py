"""The Prometheus source against series it must not believe (issue 19, findings 1 and 6):
malformed GPU identifiers are dropped and counted, never listed in a later query; a GPU claimed by
two nodes is dropped; regex literals are valid RE2 inside a valid PromQL string for any text."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.sources.metrics.fake_http import QuietHandler, range_selector, serving

from gpu_efficiency.engine.model import Window
from gpu_efficiency.engine.trust import DropReason
from gpu_efficiency.sources.metrics.base import ActivityHints, FaultHints, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.labels import valid_uuid
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.promql import CANDIDATE_LABEL
from gpu_efficiency.sources.metrics.prometheus.regex_lists import regex_literal
from gpu_efficiency.sources.metrics.prometheus.windows import fold_window

WINDOWS = {Window.ACTIVITY: 600.0, Window.FAULT: 120.0}
BAD_UUIDS = ("GPU-x\ny", "GPU-\\c", "GPU-é€", 'GPU-"', "XYZ-1", "GPU-")
GOOD = {"UUID": "GPU-1", "gpu": "0", "Hostname": "n1", "modelName": "H100", "pod": "p", "namespace": "ns"}


def _vector(series: list[dict[str, str]]) -> bytes:
    result = [{"metric": m, "value": [1700000000.0, "1"]} for m in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


class _Forged(QuietHandler):
    """Identity and fault candidates with malformed UUIDs beside a real GPU."""

    identity: list[dict[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        self.server.queries.append(query)  # type: ignore[attr-defined]
        if query.startswith("group by (UUID"):
            payload = _vector(self.identity)
        elif CANDIDATE_LABEL in query:
            payload = _vector(
                [{"UUID": u, CANDIDATE_LABEL: Window.FAULT.value} for u in (*BAD_UUIDS, "GPU-1")]
            )
        else:
            payload = _vector([])
        self.reply_json(payload)


@pytest.fixture
def forged() -> Iterator[ThreadingHTTPServer]:
    with serving(_Forged, queries=[]) as server:
        yield server


def _fetch(server: ThreadingHTTPServer, identity: list[dict[str, str]]) -> Any:
    _Forged.identity = identity
    source = PrometheusSource(PrometheusConfig(url=f"http://127.0.0.1:{server.server_address[1]}"))
    return source.fetch(
        FetchRequest(now=1700000000.0, windows=WINDOWS, scrape_interval=15.0, hints=FaultHints())
    )


def test_malformed_gpu_ids_are_dropped_counted_and_never_queried(forged: ThreadingHTTPServer) -> None:
    identity = [GOOD, *({**GOOD, "UUID": u} for u in BAD_UUIDS)]
    result = _fetch(forged, identity)
    assert [g.uuid for g in result.gpus] == ["GPU-1"]
    # every bad UUID once in identity and once among the fault candidates ("XYZ-1", "GPU-" too)
    assert result.dropped == {DropReason.INVALID_ID: 2 * len(BAD_UUIDS)}
    restricted = [q for q in forged.queries if 'UUID=~"' in q]  # type: ignore[attr-defined]
    assert restricted, "the fault window is fetched for the valid candidate"
    for query in restricted:
        assert 'UUID=~"GPU-1"' in query
        assert "\n" not in query
        assert "\\c" not in query
        assert "é" not in query


def test_a_gpu_claimed_by_two_nodes_is_dropped(forged: ThreadingHTTPServer) -> None:
    forged_node = {**GOOD, "Hostname": "n2", "pod": "victim"}
    other = {**GOOD, "UUID": "GPU-2", "gpu": "1", "pod": "q"}
    result = _fetch(forged, [GOOD, forged_node, other])
    assert [g.uuid for g in result.gpus] == ["GPU-2"]
    assert result.dropped[DropReason.NODE_CONFLICT] == 1


def test_a_series_without_a_node_does_not_conflict(forged: ThreadingHTTPServer) -> None:
    bare = {k: v for k, v in GOOD.items() if k != "Hostname"}
    result = _fetch(forged, [bare, GOOD])
    assert [(g.uuid, g.node) for g in result.gpus] == [("GPU-1", "n1")]
    assert DropReason.NODE_CONFLICT not in result.dropped


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("GPU-5c0a1b2c-3d4e-5f60-7182-93a4b5c6d7e8", True),
        ("MIG-5c0a1b2c-3d4e-5f60-7182-93a4b5c6d7e8", True),
        ("MIG-GPU-5c0a1b2c-3d4e-5f60-7182-93a4b5c6d7e8/3/0", True),
        ("GPU-node-0-1", True),
        ("GPU-1\n", False),
        ("gpu-1", False),
        ("GPU-" + "a" * 200, False),
    ],
)
def test_uuid_shapes(text: str, valid: bool) -> None:
    assert valid_uuid(text) is valid


_ESCAPE = re.compile(r"\\\\(?:x\{([0-9a-f]+)\}|([!-/:-@\[-`{-~]))")


@given(st.text(max_size=30))
def test_regex_literal_is_plain_or_hex_escaped_and_round_trips(text: str) -> None:
    """Only [A-Za-z0-9_-] travel as they are; ASCII punctuation but '"' escaped with a backslash,
    every other character as RE2's \\x{hex}, each backslash doubled for the PromQL string (checked
    with promtool 3.x and Go's regexp: quotes, newlines, backslashes and non-ASCII that the old
    escaping broke now parse and match only themselves)."""
    escaped = regex_literal(text)
    assert '"' not in escaped
    assert escaped.isascii()
    assert escaped.isprintable()
    assert _ESCAPE.sub(lambda m: m.group(2) or chr(int(m.group(1), 16)), escaped) == text


class _Flood(QuietHandler):
    """Every query answered with 50 series of one GPU (a flood of forged duplicates); a plain range
    selector (raw samples of the whole activity window) with 50 such series of samples."""

    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        series = [{**GOOD, "pod": f"p{i}"} for i in range(50)]
        if range_selector(query):
            result = [{"metric": m, "values": [[1700000000.0, "1"]]} for m in series]
            self.reply_json(
                json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
            )
        else:
            self.reply_json(_vector(series))


@pytest.mark.parametrize("tiered", [False, True])
def test_an_answer_over_the_series_cap_makes_the_source_unavailable(tiered: bool) -> None:
    with serving(_Flood) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(PrometheusConfig(url=url, max_series=49), refresh_budget=10 * tiered)
        request = FetchRequest(
            now=1700000000.0, windows=WINDOWS, scrape_interval=15.0, activity=ActivityHints(0.01)
        )
        with pytest.raises(SourceUnavailable, match="more than 49 series"):
            source.fetch(request)
        source.config = PrometheusConfig(url=url, max_series=50)
        assert [g.uuid for g in source.fetch(request).gpus] == ["GPU-1"]


def test_a_window_answer_over_the_cap_stops_while_streaming() -> None:
    chunks = [[{"metric": {"UUID": "GPU-1", "gpueff_agg": "SM_ACTIVE:max"}, "value": [0, "1"]}] * 3] * 2
    assert fold_window(chunks, 6)["GPU-1", ""]
    with pytest.raises(SourceUnavailable, match="more than 5 series"):
        fold_window(chunks, 5)
