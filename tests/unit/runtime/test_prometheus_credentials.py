"""The operator's Prometheus credentials go only to allowed URLs (issue 19, finding 5).

Before the fix, any policy's ``spec.metrics.prometheus.url`` received the operator-wide bearer
token and basic auth: a policy author could collect them or aim them at an internal service."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from kubernetes import client
from pydantic import ValidationError

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.config import add_setting_arguments, config_from_args
from gpu_efficiency.engine.model import Window
from gpu_efficiency.http_headers import parse_headers
from gpu_efficiency.runtime.deps import SourceCache, WithoutCredentials
from gpu_efficiency.settings import SettingError
from gpu_efficiency.sources.metrics.base import FetchRequest, SourceUnavailable, StaticSource
from gpu_efficiency.sources.metrics.prometheus import PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.credentials import credentials_allowed

OWN = "http://prometheus.monitoring.svc:9090"


def _headers(tmp_path: Path, policy_url: str | None, *flags: str) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    auth = tmp_path / "auth"
    auth.write_text("user:pass\n")
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    argv = [
        f"--prometheus-url={OWN}",
        f"--prometheus-token-file={token}",
        f"--prometheus-basic-auth-file={auth}",
    ]
    config = config_from_args(parser.parse_args([*argv, *flags, "--agent-urls=http://agent:1"]))
    spec = GPUEfficiencyPolicySpec.model_validate({"metrics": {"prometheus": {"url": policy_url}}})
    source = SourceCache(config, client.ApiClient())("p", spec)
    prometheus = source.source if isinstance(source, WithoutCredentials) else source
    assert isinstance(prometheus, PrometheusSource)
    headers = prometheus.client.headers()
    if prometheus.client.auth() is not None:
        headers["basic"] = ":".join(prometheus.client.auth() or ())
    return headers


def test_the_operators_own_prometheus_gets_the_credentials(tmp_path: Path) -> None:
    for url in (None, OWN, OWN + "/", OWN + "/api/prom"):
        assert _headers(tmp_path, url) == {"Authorization": "Bearer s3cret", "basic": "user:pass"}


@pytest.mark.parametrize(
    "url",
    [
        "http://collector.attacker.svc:8080",
        "http://prometheus.monitoring.svc:9091",
        "https://prometheus.monitoring.svc:9090",
    ],
)
def test_a_policys_other_prometheus_gets_no_credentials(tmp_path: Path, url: str) -> None:
    assert _headers(tmp_path, url) == {}


TENANT = "--prometheus-headers=X-Scope-OrgID: gpu-team,THANOS-TENANT: gpu-team"


def test_extra_headers_go_where_the_credentials_go(tmp_path: Path) -> None:
    """A tenant header may be the only thing a gateway checks: a policy's other URL gets none."""
    own = _headers(tmp_path, OWN, TENANT)
    assert own == {
        "Authorization": "Bearer s3cret",
        "basic": "user:pass",
        "X-Scope-OrgID": "gpu-team",
        "THANOS-TENANT": "gpu-team",
    }
    assert _headers(tmp_path, "http://collector.attacker.svc:8080", TENANT) == {}


def test_the_allow_list_flag_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    thanos = "https://thanos.monitoring.svc/query"
    assert _headers(tmp_path, thanos + "/tenant", f"--prometheus-credentials-for={OWN},{thanos}")
    assert _headers(tmp_path, OWN, f"--prometheus-credentials-for={thanos}") == {}
    monkeypatch.setenv("GPUEFF_PROMETHEUS_CREDENTIALS_FOR", thanos)
    assert _headers(tmp_path, thanos)
    assert _headers(tmp_path, "https://thanos.monitoring.svc/queryx") == {}


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://prom:9090", True),
        ("HTTP://PROM:9090/", True),
        ("http://prom:9090/sub/path", True),
        ("http://prom", False),  # port 80, not 9090
        ("http://prom:9090.evil.example", False),
        ("http://prom:9090@evil.example", False),
        ("http://evil.example#@prom:9090", False),
        ("https://prom:9090", False),
        ("http://prom:99999", False),
        ("ftp://prom:9090", False),
        ("", False),
    ],
)
def test_prefixes_compare_as_urls(url: str, allowed: bool) -> None:
    assert credentials_allowed(url, ["http://prom:9090"]) is allowed


def test_default_ports_are_the_schemes() -> None:
    assert credentials_allowed("https://prom/x", ["https://prom:443"])
    assert credentials_allowed("http://prom:80/api", ["http://prom/api"])
    assert not credentials_allowed("http://prom/apix", ["http://prom/api"])


def test_a_failure_without_credentials_says_why() -> None:
    source = WithoutCredentials(
        StaticSource(error="Prometheus refused the credentials (HTTP 401)"), "http://x"
    )
    request = FetchRequest(now=0.0, windows={Window.ACTIVITY: 60.0}, scrape_interval=15.0)
    with pytest.raises(
        SourceUnavailable,
        match=r"HTTP 401\) \(no credentials or --prometheus-headers sent: http://x is not under",
    ):
        source.fetch(request)


@pytest.mark.parametrize(
    "url",
    [
        "file:///var/run/secrets/kubernetes.io/serviceaccount/token",
        "http://user:pass@prom:9090",
        "http://prom:9090/?query=up",
        "http://prom:9090/#x",
        "prom:9090",
        "http://prom 9090",
        "gopher://prom:70",
        "http://" + "a" * 2048,
    ],
)
def test_the_schema_rejects_urls_that_are_not_plain_http_bases(url: str) -> None:
    with pytest.raises(ValidationError, match="url"):
        GPUEfficiencyPolicySpec.model_validate({"metrics": {"prometheus": {"url": url}}})


def _config(*flags: str) -> None:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    config_from_args(parser.parse_args([*flags, "--agent-urls=http://agent:1"]))


@pytest.mark.parametrize(
    ("pairs", "why"),
    [
        ("X-Scope-OrgID", "is not 'Name: value'"),
        (": team", "is not 'Name: value'"),
        ("X Scope: team", "is not an HTTP header name"),
        ("X-Scope-OrgID: team\r\nX-Admin: 1", "line break"),
        ("X-Scope-OrgID: t\u00e9am", "outside printable ASCII"),
        ("Authorization: Bearer abc", "use the bearer-token or basic-auth file"),
        ("host: evil.example", "set by the operator itself"),
        ("X-Scope-OrgID: a,x-scope-orgid: b", "given twice"),
    ],
)
def test_a_bad_header_stops_the_process_at_start_up(
    pairs: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(
        SettingError, match=r"--prometheus-headers / \$GPUEFF_PROMETHEUS_HEADERS: .*" + re.escape(why)
    ):
        _config(f"--prometheus-headers={pairs}")
    monkeypatch.setenv("GPUEFF_PROMETHEUS_HEADERS", pairs)
    with pytest.raises(SettingError, match=re.escape(why)):
        _config()


def test_header_values_keep_their_own_colons_and_equals_signs() -> None:
    assert parse_headers([" X-Api-Key :  a:b==  ", "X-Scope-OrgID: team-a|team-b"]) == {
        "X-Api-Key": "a:b==",
        "X-Scope-OrgID": "team-a|team-b",
    }
    assert parse_headers([]) == {}
