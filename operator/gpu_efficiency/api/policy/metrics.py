"""Where a policy reads DCGM metrics from, and how much data is enough for a verdict."""

from __future__ import annotations

from pydantic import Field

from gpu_efficiency.api.policy.base import Duration, Model

#: An http(s) base URL without user info, query or fragment (or empty: the operator's own).
PROMETHEUS_URL_PATTERN = (
    r"^$|^https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~!$'()*+,;=:@%/\-]*)?$"
)


class PrometheusSource(Model):
    """Where DCGM metrics are read from. Credentials come from the operator's flags/environment."""

    url: str | None = Field(default=None, max_length=2048, pattern=PROMETHEUS_URL_PATTERN)
    """http(s) base URL of Prometheus; empty: --prometheus-url. Credentials only go where allowed."""
    scrape_interval: Duration = Duration("15s")
    """The scrape interval of the DCGM metrics, used to judge how many samples a window should hold."""
    min_coverage: float = Field(default=0.6, ge=0.05, le=1.0)
    """Fraction of the expected samples a GPU must have in the window; fewer gives the verdict Unknown."""
    max_staleness: Duration = Duration("2m")
    """A GPU whose newest sample is older than this gets the verdict Unknown."""
    query_timeout: Duration = Duration("10s")
    """Timeout of one PromQL query."""


class MetricsSource(Model):
    """Metric sources and how much data is enough."""

    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    """Prometheus holding dcgm-exporter or node-agent metrics."""
    node_agent: bool = False
    """Also read the operator's node agents directly (faster fault detection, true activity without DCGM)."""
