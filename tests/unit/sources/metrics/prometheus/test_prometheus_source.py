"""Prometheus source: label variants, constant query count, assembly, errors and retries (through an
``httpx.MockTransport``; one test through real HTTP, gzip included)."""

from __future__ import annotations

import base64
import gzip
import json
import math
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import certifi
import httpx
import pytest
from tests.unit.sources.metrics.fake_http import QuietHandler, form, json_answer, serving

from gpu_efficiency.engine.model import PodRef, Signal, Window
from gpu_efficiency.sources.metrics.base import FaultHints, FetchRequest, FetchResult, SourceUnavailable
from gpu_efficiency.sources.metrics.labels import pod_of
from gpu_efficiency.sources.metrics.prometheus import (
    PrometheusClient,
    PrometheusConfig,
    PrometheusSource,
    decode_vector,
    form_value,
)
from gpu_efficiency.sources.metrics.prometheus.promql import AGG_LABEL, QUERY_PLAN, cycle_queries

WINDOWS = {
    Window.ACTIVITY: 600.0,
    Window.FAULT: 120.0,
    Window.THERMAL_HOLD: 120.0,
    Window.THERMAL_RECOVERY: 300.0,
}


@pytest.mark.parametrize(
    "text",
    [
        'max by (UUID) (x{UUID=~"GPU-1|GPU-2"}) % 16 >= 8',
        "a;b&c=d+e%f%25 é #g\n",
        "%%2B+&&==;;",
        "",
    ],
)
def test_form_value_round_trips_through_a_form_parser(text: str) -> None:
    body = "query=" + form_value(text) + "&time=1.000"
    assert parse_qs(body, keep_blank_values=True, strict_parsing=True) == {"query": [text], "time": ["1.000"]}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"pod": "a", "namespace": "ns", "container": "c"}, PodRef("ns", "a", "c")),
        (
            {"exported_pod": "a", "exported_namespace": "ns", "pod": "dcgm-x", "namespace": "gpu"},
            PodRef("ns", "a", ""),
        ),
        ({"pod_name": "a", "pod_namespace": "ns", "container_name": "c"}, PodRef("ns", "a", "c")),
        ({"pod": "", "namespace": ""}, None),
        ({"pod": "a"}, None),
        ({}, None),
    ],
)
def test_pod_label_variants(labels: dict[str, str], expected: PodRef | None) -> None:
    assert pod_of(labels) == expected


def test_fault_windows_are_filtered_by_hints() -> None:
    hints = FaultHints(
        gpu_temperature_above=90, memory_temperature_above=95, held_nodes=frozenset({"node-a.x"})
    )
    queries = {q.window: q.text for q in cycle_queries(WINDOWS, hints=hints)}
    fault = queries[Window.FAULT]
    assert "and on (UUID, GPU_I_ID)" in fault
    for selector in (  # both DCGM name families (api/exporter_fields.py)
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        '{__name__=~"DCGM_FI_DEV_XID_ERROR(S|)"}',
        '{__name__=~"DCGM_FI_DEV_ROW_REMAP_FAIL(URE|ED)"}',
    ):
        assert f"max_over_time({selector}[120s]) > 0)" in fault
    for label in ("Hostname", "hostname"):  # held nodes are always fetched (recovery needs them)
        assert f'{label}=~"node-a\\\\.x"' in fault
        assert f'{label}=~"node-a\\\\.x"' in queries[Window.THERMAL_RECOVERY]
    thermal = queries[Window.THERMAL_HOLD]
    for fragment in ("> 90)", "> 95)", "[120s]) % 128, 31) % 16 >= 8)"):
        assert fragment in thermal
    assert 'Hostname=~"node-a\\\\.x"' in queries[Window.THERMAL_RECOVERY]


def test_recovery_window_skipped_without_held_nodes() -> None:
    queries = cycle_queries(WINDOWS, hints=FaultHints(gpu_temperature_above=90))
    assert [q.window for q in queries] == [None, Window.ACTIVITY, Window.FAULT, Window.THERMAL_HOLD]


def test_query_count_is_constant_and_covers_plan() -> None:
    queries = cycle_queries(WINDOWS)
    assert len(queries) == 1 + len(WINDOWS)
    for query in queries[1:]:
        assert query.window is not None
        for signal, aggs in QUERY_PLAN[query.window].items():
            for agg in aggs:
                assert f'"{signal.name}:{agg}"' in query.text
    assert "DCGM_FI_DEV_CLOCK(S_EVENT|_THROTTLE)_REASONS" in queries[1].text  # old clock-event name read too


def _vector(series: list[tuple[dict[str, str], Any]]) -> bytes:
    result = [{"metric": m, "value": [1700000000.0, str(v)]} for m, v in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_decode_vector_errors() -> None:
    with pytest.raises(SourceUnavailable, match="invalid JSON"):
        decode_vector(b"<html>")
    with pytest.raises(SourceUnavailable, match="bad_data"):
        decode_vector(json.dumps({"status": "error", "error": "bad_data: parse error"}).encode())
    assert math.isnan(decode_vector(_vector([({"a": "b"}, "NaN")]))[0][1])


class FakePrometheus:
    """Answers identity and window queries like Prometheus would for two GPUs; records each query."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.queries: list[str] = []
        self.auth: list[str | None] = []
        self.tenants: list[str | None] = []

    def answer(self, query: str) -> bytes:
        if query.startswith("group by (UUID"):
            gpu1 = {"UUID": "GPU-1", "gpu": "0", "Hostname": "n1", "modelName": "H100", "namespace": "ns"}
            return _vector(
                [
                    ({**gpu1, "pod": "p"}, 1),
                    ({**gpu1, "pod": "q"}, 1),
                    ({"UUID": "GPU-2", "gpu": "1", "Hostname": "n1", "modelName": "H100"}, 1),
                ]
            )
        if "SM_ACTIVE" in query:
            return _vector(
                [
                    ({"UUID": "GPU-1", AGG_LABEL: "SM_ACTIVE:max"}, 0.5),
                    ({"UUID": "GPU-1", AGG_LABEL: "SM_ACTIVE:count"}, 40),
                    ({"UUID": "GPU-1", AGG_LABEL: "SM_ACTIVE:ts"}, 1699999990),
                    ({"UUID": "GPU-2", AGG_LABEL: "SM_ACTIVE:max"}, "NaN"),
                ]
            )
        return _vector([])

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/api/v1/query")
        assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
        query = form(request)["query"][0]
        self.queries.append(query)
        self.auth.append(request.headers.get("Authorization"))
        self.tenants.append(request.headers.get("X-Scope-OrgID"))
        if self.status != 200:
            return httpx.Response(self.status, text="unavailable")
        return json_answer(self.answer(query))

    def source(self, **config: Any) -> PrometheusSource:
        settings = {"url": "http://prometheus.test", **config}
        return PrometheusSource(PrometheusConfig(**settings), transport=httpx.MockTransport(self.handle))


def _check_assembled(result: FetchResult) -> None:
    by_uuid = {g.uuid: g for g in result.gpus}
    gpu1 = by_uuid["GPU-1"]
    assert (gpu1.node, gpu1.index) == ("n1", "0")
    assert gpu1.pods == (PodRef("ns", "p"), PodRef("ns", "q"))  # a shared GPU lists both pods
    sm = gpu1.get(Window.ACTIVITY, Signal.SM_ACTIVE)
    assert sm is not None
    assert (sm.max, sm.count, sm.last_timestamp) == (0.5, 40, 1699999990)
    assert math.isnan(sm.avg)  # not returned: stays NaN, never 0
    assert gpu1.expected_samples[Window.ACTIVITY] == 40
    assert by_uuid["GPU-2"].pods == ()


def test_fetch_assembles_samples(tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    fake = FakePrometheus()
    result = fake.source(token_file=str(token)).fetch(
        FetchRequest(now=1700000000.0, windows=WINDOWS, scrape_interval=15.0)
    )
    assert result.queries == 6 == len(fake.queries)  # identity, inventory, 4 windows
    assert set(fake.auth) == {"Bearer s3cret"}
    _check_assembled(result)


def test_every_query_carries_the_extra_headers() -> None:
    """Mimir and Cortex refuse a query without its tenant (--prometheus-headers): the identity,
    inventory and every window query carry it, beside the bearer token."""
    fake = FakePrometheus()
    fake.source(extra_headers={"X-Scope-OrgID": "gpu-team"}).fetch(
        FetchRequest(now=1700000000.0, windows=WINDOWS, scrape_interval=15.0)
    )
    assert len(fake.tenants) == 6
    assert set(fake.tenants) == {"gpu-team"}
    assert set(fake.auth) == {None}


class _GzipPrometheus(QuietHandler):
    """The fake over real HTTP, answering gzip-compressed as Prometheus does when asked."""

    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        self.server.encodings.append(self.headers.get("Accept-Encoding", ""))  # type: ignore[attr-defined]
        body = gzip.compress(FakePrometheus().answer(query))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_fetch_over_real_http_with_gzip_and_basic_auth(tmp_path: Any) -> None:
    secret = tmp_path / "basic"
    secret.write_text("user:pa:ss\n")
    with serving(_GzipPrometheus, encodings=[]) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(PrometheusConfig(url=url, basic_auth_file=str(secret)))
        result = source.fetch(FetchRequest(now=1700000000.0, windows=WINDOWS, scrape_interval=15.0))
        assert all("gzip" in e for e in server.encodings)  # type: ignore[attr-defined]
    _check_assembled(result)


def test_basic_auth_is_read_from_its_file_at_each_query(tmp_path: Any) -> None:
    secret = tmp_path / "basic"
    secret.write_text("user:pa:ss\n")
    fake = FakePrometheus()
    source = fake.source(basic_auth_file=str(secret))
    source.query("up")
    secret.write_text("user:rotated\n")
    source.query("up")
    assert fake.auth == [
        "Basic " + base64.b64encode(b"user:pa:ss").decode(),
        "Basic " + base64.b64encode(b"user:rotated").decode(),
    ]


@pytest.mark.parametrize(
    ("status", "message"), [(503, "HTTP 503: unavailable"), (401, "refused the credentials")]
)
def test_http_errors_are_unavailable(status: int, message: str) -> None:
    source = FakePrometheus(status).source(retries=0)
    with pytest.raises(SourceUnavailable, match=message):
        source.fetch(FetchRequest(now=1.0, windows=WINDOWS, scrape_interval=15.0))


def test_an_error_answer_is_reported_at_once_not_retried() -> None:
    """With the default retries, a 503 is one request and reads as HTTP 503, as it did when
    prometheus-api-client's adapter (no POST retries) replaced the one the source declared."""
    fake = FakePrometheus(503)
    with pytest.raises(SourceUnavailable, match="HTTP 503"):
        fake.source().query("up")
    assert fake.queries == ["up"]


def test_failed_connections_are_retried_as_configured() -> None:
    attempts: list[float] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(time.monotonic())
        raise httpx.ConnectError("connection refused", request=request)

    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test", retries=2), transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(SourceUnavailable, match="unreachable: connection refused"):
        source.query("up")
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] < 0.15 <= attempts[2] - attempts[1]  # at once, then backing off


def test_a_broken_read_is_reported_not_retried() -> None:
    calls: list[str] = []

    def broken(request: httpx.Request) -> httpx.Response:
        calls.append(form(request)["query"][0])
        raise httpx.ReadError("connection reset", request=request)

    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test"), transport=httpx.MockTransport(broken)
    )
    with pytest.raises(SourceUnavailable, match="connection reset"):
        source.query("up")
    assert calls == ["up"]


def test_unreachable_is_unavailable() -> None:
    source = PrometheusSource(PrometheusConfig(url="http://127.0.0.1:9", retries=0, timeout=1))
    with pytest.raises(SourceUnavailable, match="unreachable"):
        source.fetch(FetchRequest(now=1.0, windows=WINDOWS, scrape_interval=15.0))


def test_the_ca_file_is_trusted_alone_and_read_again_when_it_rotates(tmp_path: Any) -> None:
    ca = tmp_path / "ca.crt"
    fake = FakePrometheus()
    source = fake.source(ca_file=str(ca))
    with pytest.raises(SourceUnavailable, match=r"CA file .*ca\.crt"):  # not mounted yet: this query fails
        source.query("up")
    assert fake.queries == []
    ca.write_bytes(Path(certifi.where()).read_bytes())
    source.query("up")
    first = source.client._session()
    assert source.client._session() is first  # unchanged file: the same client and connections
    ca.write_bytes(Path(certifi.where()).read_bytes() + b"\n")
    assert source.client._session() is not first
    ca.write_text("not a certificate\n")
    with pytest.raises(SourceUnavailable, match="CA file"):
        source.query("up")
    assert fake.queries == ["up"]


@pytest.mark.parametrize(("insecure", "verify_mode"), [(False, ssl.CERT_REQUIRED), (True, ssl.CERT_NONE)])
def test_tls_verification_follows_insecure_skip_verify(insecure: bool, verify_mode: ssl.VerifyMode) -> None:
    client = PrometheusClient(PrometheusConfig(url="https://prometheus.test", insecure_skip_verify=insecure))
    transport = client._session()._transport
    assert isinstance(transport, httpx.HTTPTransport)
    assert transport._pool._ssl_context.verify_mode == verify_mode
