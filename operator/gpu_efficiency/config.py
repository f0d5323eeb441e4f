"""The operator's settings, declared once: each field of OperatorConfig is one setting, and its flag,
its ``GPUEFF_*`` variable and its row in docs/cli.md come from that declaration (settings.py).

A flag overrides its variable, which overrides the default. The CLI builds one OperatorConfig and
passes it on explicitly (Kopf's memo for `run`); no module holds it.

``python -m gpu_efficiency.config docs/cli.md`` (``make docs``) rewrites the settings table there.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import cached_property

from gpu_efficiency.api.policy import ALWAYS_PROTECTED_NAMESPACES
from gpu_efficiency.http_headers import HeaderError, parse_headers
from gpu_efficiency.settings import (
    Setting,
    SettingError,
    add_arguments,
    computed_setting,
    render_table,
    replace_section,
    resolve,
    setting,
    settings_of,
)

#: Default label matchers of every DCGM query: the scrape jobs (a label Prometheus itself sets) of
#: dcgm-exporter as the GPU Operator names it (NVIDIA/gpu-operator ``assets/state-dcgm-exporter/
#: 0500_service_monitor.yaml``: ``jobLabel: app``, the Service's ``app: nvidia-dcgm-exporter``), as its own chart
#: does (NVIDIA/dcgm-exporter ``deployment/templates/_helpers.tpl``: the Service is the release's
#: full name, ``<release>-dcgm-exporter``, or the release name itself when it already holds
#: ``dcgm-exporter``, so ``helm install dcgm ...`` gives ``dcgm-dcgm-exporter`` and the README's
#: ``--generate-name`` gives ``dcgm-exporter-<timestamp>``; the ServiceMonitor sets no jobLabel, so
#: the job is the Service's name), NVIDIA's kube-prometheus example (gpu-metrics), a plain "dcgm" job
#: and this chart's node agent (node-agent). Series another tenant's scrape target publishes carry
#: its own job and are not read. Set --prometheus-matchers to your exporter's job (and, with
#: honorLabels false, its namespace, e.g. namespace="gpu-operator"); an explicit empty value reads
#: every job. Short on purpose: every window term repeats it (67 in the activity window), and
#: longer matchers cut the windows into more queries to keep each under 16 KiB (promql.py).
DEFAULT_MATCHERS = 'job=~".*dcgm-exporter.*|dcgm|gpu-metrics|node-agent"'
#: Default cap on the series of one Prometheus answer (--prometheus-max-series): ~30,000 GPUs'
#: activity windows (67 series a GPU). More means a flood: the cycle reads "metrics unavailable".
DEFAULT_MAX_SERIES = 2_000_000


def _identity() -> str:
    return os.environ.get("POD_NAME") or os.uname().nodename + f"-{os.getpid()}"


@dataclass(frozen=True)
class OperatorConfig:
    """Every command's settings; one not given keeps its default."""

    prometheus_url: str = setting("http://127.0.0.1:9090", "Prometheus base URL", scope="shared")
    prometheus_token_file: str | None = setting(None, "bearer token file for Prometheus", scope="shared")
    prometheus_basic_auth_file: str | None = setting(
        None, "file 'user:password' for Prometheus basic auth", scope="shared"
    )
    prometheus_ca_file: str | None = setting(None, "CA bundle for Prometheus TLS", scope="shared")
    prometheus_insecure: bool = setting(
        False,
        "do not verify Prometheus' TLS certificate",
        scope="shared",
        flag="--prometheus-insecure-skip-verify",
    )
    prometheus_matchers: str = setting(
        DEFAULT_MATCHERS, "label matchers added to every DCGM selector (empty: any job)", scope="shared"
    )
    prometheus_max_series: int = setting(
        DEFAULT_MAX_SERIES,
        "most series one Prometheus answer may hold (at least 1); more makes the cycle's metrics unavailable",
        scope="shared",
        minimum=1,
    )
    prometheus_refresh_budget: int = setting(
        0,
        "tiered activity refresh: each cycle fetch the activity window fresh only for new, "
        "re-attributed, idle or possibly idle GPUs and reuse the others' (busy, and still busy by a "
        "cheap filter); after each cycle, refresh about this many least recently refreshed ones in the "
        "background for later cycles; 0: every GPU every cycle (sources/metrics/prometheus/tiered/activity_cache.py)",
        scope="run",
        minimum=0,
    )
    prometheus_credentials_for: tuple[str, ...] = setting(
        (),
        "comma list of Prometheus URL prefixes that may receive the token and basic auth (empty: "
        "--prometheus-url only); a policy's spec.metrics.prometheus.url elsewhere is queried without "
        "credentials",
        scope="shared",
    )
    prometheus_headers: tuple[str, ...] = setting(
        (),
        "comma list of 'Name: value' HTTP headers sent with every Prometheus query where the "
        "credentials go, e.g. the tenant of Mimir or Cortex, 'X-Scope-OrgID: gpu-team' (not "
        "Authorization: use the token or basic-auth file)",
        scope="shared",
    )
    namespace: str = setting(
        "gpu-efficiency-system",
        "the operator's own namespace, always protected (not the namespace `report -n` looks at)",
        scope="shared",
        flag="--operator-namespace",
    )
    protected_namespaces: tuple[str, ...] = setting(
        (), "comma list of namespaces never touched (besides the system ones and our own)", scope="shared"
    )
    dry_run: bool = setting(False, "never write to the cluster", scope="run")
    leader_election: bool = setting(
        True,
        "act only while holding the Lease (replicas stand by)",
        scope="run",
        negation="--no-leader-election",
    )
    lease_name: str = setting("gpu-efficiency-operator", "name of the leader-election Lease", scope="run")
    lease_seconds: float = setting(15.0, "leader-election Lease duration in seconds", scope="run")
    identity: str = computed_setting(
        _identity,
        "leader-election identity",
        scope="run",
        default_doc="$POD_NAME, else HOST-PID",
    )
    metrics_port: int = setting(8080, "port of /metrics; 0 disables it", scope="run")
    health_port: int = setting(8081, "port of /healthz; 0 disables it", scope="run")
    api_timeout: float = setting(
        30.0,
        "seconds to connect and per read of every Kubernetes API call (watches keep their own)",
        scope="run",
    )
    status_refresh_seconds: float = setting(
        300.0,
        "at most this often (seconds) a policy's status is rewritten for its counters alone (idle GPU-hours, waste)",
        scope="run",
    )
    agent_urls: tuple[str, ...] = setting((), "comma list of node-agent base URLs", scope="shared")
    agent_token_file: str | None = setting(
        None,
        "bearer token sent to the node agents (their --auth tokenreview), e.g. the service-account token",
        scope="run",
    )
    watch_cache: bool = setting(
        True,
        "keep pods, nodes, namespaces, DRA objects and the pods' owners in watch-based caches instead of listing them every cycle",
        scope="run",
        negation="--no-watch-cache",
    )
    fault_wake_min_gap: float = setting(
        2.0,
        "a node agent's GPUHealthy=False runs the cycle of each policy covering the node at once "
        "(faults enabled, metrics.nodeAgent): at most one such early cycle per policy every this many "
        "seconds; 0 turns early cycles off",
        scope="run",
        minimum=0,
    )
    log_level: str = setting("INFO", "log level (DEBUG, INFO, WARNING, ERROR)", scope="run")
    log_format: str = setting("text", "log format", scope="run", choices=("text", "json"))
    slack_signing_secret_file: str = setting(
        "",
        "file of the Slack app's signing secret (the chart mounts it from a Secret): Slack warnings get Keep "
        "for / Release now buttons, answered at /slack/actions on the self-service port; empty: off",
        scope="run",
    )
    slack_response_urls: str = setting(
        "https://hooks.slack.com/,https://hooks.slack-gov.com/",
        "comma-separated URL prefixes a Slack click's response_url may have (the message is updated "
        "there); other targets are never posted to",
        scope="run",
    )
    notify_secret_dir: str = setting(
        "/etc/gpu-efficiency/notify",
        "directory of the mounted notify Secret: one webhook URL per file (spec.notify[].urlSecretKey)",
        scope="run",
    )
    selfservice_port: int = setting(
        0,
        "port of the researchers' self-service page (keep or release a warned GPU, the evidence drawn); "
        "0 disables it",
        scope="run",
    )
    selfservice_url: str = setting(
        "",
        "public base URL of the self-service page (its Ingress or Service, e.g. https://gpu.example.com): "
        "warnings carry a signed link under it; empty, or --selfservice-port 0: no links",
        scope="run",
    )
    selfservice_key_file: str = setting(
        "/etc/gpu-efficiency/selfservice/key",
        "file of the HMAC-SHA256 key (32 bytes or more) signing self-service links: the chart mounts a Secret",
        scope="run",
    )
    currency: str = setting(
        "USD", "currency of the policy's pricePerGpuHour, shown with the waste", scope="report"
    )

    @property
    def selfservice_links(self) -> bool:
        """Warnings carry a signed link: the page is served and has a public address."""
        return self.selfservice_port > 0 and bool(self.selfservice_url)

    def __post_init__(self) -> None:
        self.prometheus_header_map  # noqa: B018  # a bad pair stops the process at start-up

    @cached_property
    def prometheus_header_map(self) -> dict[str, str]:
        """``prometheus_headers`` as a header map (http_headers.py), parsed once; SettingError on a
        bad pair."""
        try:
            return parse_headers(self.prometheus_headers)
        except HeaderError as exc:
            raise SettingError(f"--prometheus-headers / $GPUEFF_PROMETHEUS_HEADERS: {exc}") from None

    @property
    def credential_prefixes(self) -> tuple[str, ...]:
        """Prometheus URL prefixes the token and basic auth may be sent to (sources/metrics/prometheus/credentials.py)."""
        return self.prometheus_credentials_for or (self.prometheus_url,)

    @property
    def all_protected_namespaces(self) -> frozenset[str]:
        """Never touched, whatever a policy says: the system namespaces and our own."""
        return frozenset((*ALWAYS_PROTECTED_NAMESPACES, self.namespace, *self.protected_namespaces))


SETTINGS: tuple[Setting, ...] = settings_of(OperatorConfig)

README_START = "<!-- settings-reference:start (generated by `make docs`) -->"
README_END = "<!-- settings-reference:end -->"


def add_setting_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of the settings ``command`` (run, report or explain) takes."""
    add_arguments(parser, SETTINGS, command)


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """The configuration from parsed flags and the environment (SettingError on bad text)."""
    return OperatorConfig(**resolve(args, SETTINGS, os.environ))


def update_readme(text: str) -> str:
    """The page's text (docs/cli.md) with its settings table regenerated."""
    return replace_section(
        text, README_START, README_END, "\n\n" + "\n".join(render_table(SETTINGS)) + "\n\n"
    )


if __name__ == "__main__":
    import sys
    from pathlib import Path

    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/cli.md")
    readme.write_text(update_readme(readme.read_text()))
