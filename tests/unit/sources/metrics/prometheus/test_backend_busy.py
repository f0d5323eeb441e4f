"""A backend too busy to run a query says why in plain text: VictoriaMetrics answers HTTP 429
(``text/plain``) when ``-search.maxConcurrentRequests`` queries run and the next has waited
``-search.maxQueueDuration`` (seen at 1,000 nodes in the scale bench: every query of a cycle). The
condition and event must quote those words, not "invalid JSON", so an admin knows which flag to
raise."""

from __future__ import annotations

import httpx
import pytest

from gpu_efficiency.engine.model import Window
from gpu_efficiency.sources.metrics.base import FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource

#: VictoriaMetrics v1.151.0's answer, as read from the scale cluster with curl.
BUSY = (
    "couldn't start executing the request in 10.000 seconds, since -search.maxConcurrentRequests=4"
    " concurrent requests are executed. Possible solutions: to reduce query load; to add more compute"
    " resources to the server; to increase -search.maxQueueDuration=10s; to increase"
    " -search.maxQueryDuration; to increase -search.maxConcurrentRequests"
)


def _fetch(status: int, text: str) -> None:
    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=text, headers={"content-type": "text/plain; charset=utf-8"})

    source = PrometheusSource(
        PrometheusConfig(url="http://victoria-metrics:8428", retries=0), transport=httpx.MockTransport(answer)
    )
    source.fetch(FetchRequest(windows={Window.ACTIVITY: 600.0}, now=1_700_000_000.0, scrape_interval=15.0))


def test_too_many_requests_quotes_the_backends_answer() -> None:
    with pytest.raises(SourceUnavailable, match=r"HTTP 429.*-search\.maxConcurrentRequests=4") as caught:
        _fetch(429, BUSY)
    assert "invalid JSON" not in str(caught.value)


@pytest.mark.parametrize("status", [405, 413, 429, 431])
def test_any_plain_text_client_error_is_quoted(status: int) -> None:
    with pytest.raises(SourceUnavailable, match=rf"\(HTTP {status}\): the backend's own words"):
        _fetch(status, "the backend's own words")
