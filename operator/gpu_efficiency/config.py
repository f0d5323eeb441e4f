"""Operator start-up configuration: flags override environment variables, which override defaults."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from gpu_efficiency.api.policy import ALWAYS_PROTECTED_NAMESPACES

#: Default label matchers of every DCGM query: the scrape jobs (a label Prometheus itself sets) of
#: dcgm-exporter as the GPU Operator (nvidia-dcgm-exporter), its own chart (dcgm-exporter) and
#: NVIDIA's kube-prometheus example (gpu-metrics) name them, a plain "dcgm" job, and this chart's
#: node agent (node-agent). Series another tenant's scrape target publishes carry its own job and
#: are not read. Set --prometheus-matchers to your exporter's job (and, with honorLabels false, its
#: namespace, e.g. namespace="gpu-operator"); an explicit empty value reads every job.
DEFAULT_MATCHERS = 'job=~"nvidia-dcgm-exporter|dcgm-exporter|gpu-metrics|dcgm|node-agent"'
#: Default cap on the series of one Prometheus answer (--prometheus-max-series): ~30,000 GPUs'
#: activity windows (67 series a GPU). More means a flood: the cycle reads "metrics unavailable".
DEFAULT_MAX_SERIES = 2_000_000


def _env(name: str, default: str = "") -> str:
    return os.environ.get(f"GPUEFF_{name}", default)


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class OperatorConfig:
    prometheus_url: str = "http://127.0.0.1:9090"
    prometheus_token_file: str | None = None
    prometheus_basic_auth_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_insecure: bool = False
    prometheus_matchers: str = DEFAULT_MATCHERS
    prometheus_max_series: int = DEFAULT_MAX_SERIES
    prometheus_refresh_budget: int = 0  # > 0: tiered activity refresh (sources/activity_cache.py)
    #: URL prefixes that may receive the Prometheus credentials; empty: only ``prometheus_url``
    prometheus_credentials_for: tuple[str, ...] = ()
    namespace: str = "gpu-efficiency-system"
    protected_namespaces: tuple[str, ...] = ()
    dry_run: bool = False
    leader_election: bool = True
    lease_name: str = "gpu-efficiency-operator"
    lease_seconds: float = 15.0
    identity: str = field(
        default_factory=lambda: os.environ.get("POD_NAME") or os.uname().nodename + f"-{os.getpid()}"
    )
    metrics_port: int = 8080
    health_port: int = 8081
    api_timeout: float = 30.0  # seconds to connect and per read of every Kubernetes API call
    status_refresh_seconds: float = 300.0
    agent_urls: tuple[str, ...] = ()
    agent_token_file: str | None = None  # bearer token for agents run with --auth tokenreview
    watch_cache: bool = True  # run: read pods, nodes and namespaces from watches (report/explain LIST)
    log_level: str = "INFO"
    log_format: str = "text"
    #: the files of the notify Secret (one webhook URL per key, spec.notify[].urlSecretKey)
    notify_secret_dir: str = "/etc/gpu-efficiency/notify"

    @property
    def credential_prefixes(self) -> tuple[str, ...]:
        """Prometheus URL prefixes the token and basic auth may be sent to (sources/credentials.py)."""
        return self.prometheus_credentials_for or (self.prometheus_url,)

    @property
    def all_protected_namespaces(self) -> frozenset[str]:
        """Never touched, whatever a policy says: the system namespaces and our own."""
        return frozenset((*ALWAYS_PROTECTED_NAMESPACES, self.namespace, *self.protected_namespaces))


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """What every command that observes needs: Prometheus and how to reach it, and the scope.

    `report` and `explain` take only these, so they reach Prometheus wherever `run` does (the chart
    sets them as GPUEFF_* variables, which a `kubectl exec` into the operator's container inherits).
    """
    a = parser.add_argument
    a("--prometheus-url", default=_env("PROMETHEUS_URL", "http://127.0.0.1:9090"), help="Prometheus base URL")
    a("--prometheus-token-file", default=_env("PROMETHEUS_TOKEN_FILE") or None, help="bearer token file")
    a(
        "--prometheus-basic-auth-file",
        default=_env("PROMETHEUS_BASIC_AUTH_FILE") or None,
        help="file 'user:password'",
    )
    a("--prometheus-ca-file", default=_env("PROMETHEUS_CA_FILE") or None, help="CA bundle for Prometheus TLS")
    a(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        default=_bool(_env("PROMETHEUS_INSECURE", "0")),
    )
    a(
        "--prometheus-matchers",
        default=_env("PROMETHEUS_MATCHERS", DEFAULT_MATCHERS),
        help=f"label matchers added to every DCGM selector (default {DEFAULT_MATCHERS}; empty: any job)",
    )
    a(
        "--prometheus-max-series",
        type=int,
        default=int(_env("PROMETHEUS_MAX_SERIES", str(DEFAULT_MAX_SERIES))),
        help="most series one Prometheus answer may hold; more makes the cycle's metrics unavailable",
    )
    a(
        "--prometheus-credentials-for",
        default=_env("PROMETHEUS_CREDENTIALS_FOR"),
        help="comma list of Prometheus URL prefixes that may receive the token and basic auth "
        "(default: --prometheus-url only); a policy's spec.metrics.prometheus.url elsewhere is "
        "queried without credentials",
    )
    a("--namespace", default=_env("NAMESPACE", "gpu-efficiency-system"), help="the operator's own namespace")
    a("--protected-namespaces", default=_env("PROTECTED_NAMESPACES"), help="comma list never touched")
    a("--agent-urls", default=_env("AGENT_URLS"), help="comma list of node-agent base URLs")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection flags and those only the long-running operator uses."""
    add_connection_arguments(parser)
    a = parser.add_argument
    a(
        "--prometheus-refresh-budget",
        type=int,
        default=int(_env("PROMETHEUS_REFRESH_BUDGET", "0")),
        help="tiered activity refresh: each cycle fetch the activity window fresh only for new, "
        "re-attributed, idle or possibly idle GPUs and reuse the others' (busy, and still busy by a "
        "cheap filter); after each cycle, refresh this many least recently refreshed ones in the "
        "background for later cycles; 0 (default): every GPU every cycle",
    )
    a(
        "--dry-run",
        action="store_true",
        default=_bool(_env("DRY_RUN", "0")),
        help="never write to the cluster",
    )
    a(
        "--leader-election",
        dest="leader_election",
        action="store_true",
        default=_bool(_env("LEADER_ELECTION", "1")),
    )
    a("--no-leader-election", dest="leader_election", action="store_false")
    a("--lease-name", default=_env("LEASE_NAME", "gpu-efficiency-operator"))
    a("--lease-seconds", type=float, default=float(_env("LEASE_SECONDS", "15")))
    a("--identity", default=_env("IDENTITY") or None, help="leader-election identity (default: pod name)")
    a("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8080")), help="0 disables /metrics")
    a("--health-port", type=int, default=int(_env("HEALTH_PORT", "8081")), help="0 disables /healthz")
    a(
        "--api-timeout",
        type=float,
        default=float(_env("API_TIMEOUT", "30")),
        help="seconds to connect and per read of every Kubernetes API call (watches keep their own)",
    )
    a("--status-refresh-seconds", type=float, default=float(_env("STATUS_REFRESH_SECONDS", "300")))
    a(
        "--agent-token-file",
        default=_env("AGENT_TOKEN_FILE") or None,
        help="bearer token sent to the node agents (their --auth tokenreview), e.g. the service-account token",
    )
    a(
        "--watch-cache",
        dest="watch_cache",
        action="store_true",
        default=_bool(_env("WATCH_CACHE", "1")),
        help="keep pods, nodes and namespaces in a watch-based cache instead of listing them every "
        "cycle (default; `run` only)",
    )
    a("--no-watch-cache", dest="watch_cache", action="store_false", help="list them every cycle")
    a(
        "--notify-secret-dir",
        default=_env("NOTIFY_SECRET_DIR", "/etc/gpu-efficiency/notify"),
        help="directory of the mounted notify Secret: one webhook URL per file (spec.notify[].urlSecretKey)",
    )
    a("--log-level", default=_env("LOG_LEVEL", "INFO"))
    a("--log-format", choices=("text", "json"), default=_env("LOG_FORMAT", "text"))


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (value or "").split(",") if p.strip())


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """The configuration from parsed flags; a command without `run`'s own flags keeps their defaults."""
    kwargs: dict[str, Any] = {}
    if getattr(args, "identity", None):
        kwargs["identity"] = args.identity
    if hasattr(args, "dry_run"):  # parsed with add_run_arguments
        kwargs.update(
            prometheus_refresh_budget=max(0, args.prometheus_refresh_budget),
            dry_run=args.dry_run,
            leader_election=args.leader_election,
            lease_name=args.lease_name,
            lease_seconds=args.lease_seconds,
            metrics_port=args.metrics_port,
            health_port=args.health_port,
            api_timeout=args.api_timeout,
            status_refresh_seconds=args.status_refresh_seconds,
            watch_cache=args.watch_cache,
            log_level=args.log_level,
            log_format=args.log_format,
            agent_token_file=args.agent_token_file,
            notify_secret_dir=args.notify_secret_dir,
        )
    return OperatorConfig(
        prometheus_url=args.prometheus_url,
        prometheus_token_file=args.prometheus_token_file,
        prometheus_basic_auth_file=args.prometheus_basic_auth_file,
        prometheus_ca_file=args.prometheus_ca_file,
        prometheus_insecure=args.prometheus_insecure_skip_verify,
        prometheus_matchers=args.prometheus_matchers,
        prometheus_credentials_for=_split(args.prometheus_credentials_for),
        prometheus_max_series=max(1, args.prometheus_max_series),
        namespace=args.namespace,
        protected_namespaces=_split(args.protected_namespaces),
        agent_urls=_split(args.agent_urls),
        **kwargs,
    )
