"""The HTTP exchange with Prometheus: one instant query per POST, its answer read by a deadline.

One ``httpx.Client`` per source (the same stack as the agent source): a connection pool, TLS trust
and gzip; bearer token and basic-auth secrets are read from files at each query so they can rotate
without a restart. Each exchange is bounded by a wall-clock deadline (``sources/metrics/deadline.py``): a
trickled body is cut off, not waited for. Readers get the body as an iterator of byte chunks, never
the response, so the decoding (``vector.py``, ``windows.py``) knows nothing of the HTTP stack. The
client takes an ``httpx`` transport: tests pass ``httpx.MockTransport`` instead of starting servers.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.deadline import Deadline, deadline, httpx_socket
from gpu_efficiency.sources.metrics.prometheus.vector import check_cap, decode_vector

_T = TypeVar("_T")


@dataclass(frozen=True)
class PrometheusConfig:
    """Connection settings; secrets are read from files so they can rotate without a restart."""

    url: str
    token_file: str | None = None
    basic_auth_file: str | None = None  # one line "user:password"
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 10.0
    retries: int = 2
    matchers: str = ""  # extra label matchers for every selector, e.g. 'job="dcgm"'
    #: Most series one answer may hold; more raises SourceUnavailable (a flood of forged series
    #: makes the cycle blind, never half-read). 0: no cap.
    max_series: int = 0
    extra_headers: Mapping[str, str] = field(default_factory=dict)


FORM = "application/x-www-form-urlencoded"
#: What must be escaped in a form value: its separators, its escape characters, and '=' for parsers
#: that split on every '=' (Go splits on '&' and rejects ';'). Everything else travels as it is.
_FORM_ESCAPES = (("%", "%25"), ("&", "%26"), ("+", "%2B"), (";", "%3B"), ("=", "%3D"))


def form_value(text: str) -> str:
    """``text`` as an ``application/x-www-form-urlencoded`` value, escaping only what a form parser
    reads specially. ``urllib.parse.quote_plus`` escapes per character in Python: ~0.2 s of CPU
    per cycle for a budget chunk's 1.4 M-character query at 8,000 GPUs; ``str.replace`` runs in C."""
    for char, escaped in _FORM_ESCAPES:
        text = text.replace(char, escaped)
    return text


#: Connections kept open between queries; more may be open at once (the tiered fetch's chains run
#: side by side), as with the ``requests`` pool this client replaced (10 kept, none refused).
KEEPALIVE_CONNECTIONS = 10
#: Seconds before the n-th connection retry (n >= 2; the first is at once): urllib3's backoff.
RETRY_BACKOFF_S = 0.2


def _is_json(response: httpx.Response) -> bool:
    return str(response.headers.get("content-type", "")).startswith("application/json")


class PrometheusClient:
    """Instant queries against one Prometheus, each by the wall-clock deadline ``config.timeout``.

    Failed connections are retried ``config.retries`` times within the deadline; answers are not:
    an error answer or a broken read is reported at once (the next cycle asks again), as urllib3
    did for a POST under the ``requests`` session this client replaced.
    """

    def __init__(self, config: PrometheusConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        """``transport``: what carries the requests (default: httpx's, with the environment's
        proxies); tests pass an ``httpx.MockTransport``."""
        self.config = config
        self.url = config.url.rstrip("/")
        self._transport = transport
        self._lock = threading.Lock()
        self._ca_stamp: tuple[int, int] | None = None
        self._client = self._new_client(not config.insecure_skip_verify)

    def _new_client(self, verify: ssl.SSLContext | bool) -> httpx.Client:
        return httpx.Client(
            verify=verify,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS),
            follow_redirects=True,
            transport=self._transport,
        )

    def _session(self) -> httpx.Client:
        """The client, trusting the CA file as it is now: a rotated file (a new mtime or size) gets a
        new client (and new connections), a missing or unreadable one SourceUnavailable, as the
        ``requests`` session read it at each new connection."""
        ca_file = self.config.ca_file
        if not ca_file:
            return self._client
        try:
            info = os.stat(ca_file)
            stamp = (info.st_mtime_ns, info.st_size)
            with self._lock:
                if stamp != self._ca_stamp:
                    # The old client is left to the collector: another thread may be reading from it.
                    self._client = self._new_client(ssl.create_default_context(cafile=ca_file))
                    self._ca_stamp = stamp
                return self._client
        except (OSError, ssl.SSLError) as exc:
            raise SourceUnavailable(f"Prometheus CA file {ca_file}: {exc}") from exc

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def headers(self) -> dict[str, str]:
        """The headers of every query: the configured extras and the bearer token, read now."""
        headers = dict(self.config.extra_headers)
        if self.config.token_file:
            token = Path(self.config.token_file).read_text().strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def auth(self) -> tuple[str, str] | None:
        """The basic-auth pair, read now; None without a basic-auth file."""
        if not self.config.basic_auth_file:
            return None
        user, _, password = Path(self.config.basic_auth_file).read_text().strip().partition(":")
        return (user, password)

    def _request(self, text: str, at: float | None, limit: Deadline) -> httpx.Response:
        """POST one instant query, streamed, its socket held by ``limit``; SourceUnavailable on
        transport, auth or HTTP errors (PromQL errors are found when the body is decoded)."""
        body = ("query=" + form_value(text) + ("" if at is None else f"&time={at:.3f}")).encode()
        headers = {**self.headers(), "Content-Type": FORM}
        attempt = 0
        while True:
            client = self._session()
            request = client.build_request(
                "POST", f"{self.url}/api/v1/query", content=body, headers=headers, timeout=limit.remaining()
            )
            try:
                response = client.send(request, auth=self.auth(), stream=True)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                attempt += 1
                pause = RETRY_BACKOFF_S * 2 ** (attempt - 1) if attempt > 1 else 0.0
                if attempt > self.config.retries or time.monotonic() + pause >= limit.end:
                    raise SourceUnavailable(f"Prometheus at {self.config.url} unreachable: {exc}") from exc
                time.sleep(pause)
            except (httpx.HTTPError, OSError) as exc:
                raise SourceUnavailable(f"Prometheus at {self.config.url} unreachable: {exc}") from exc
        limit.hold(httpx_socket(response))
        if response.status_code in (401, 403):
            response.close()
            raise SourceUnavailable(f"Prometheus refused the credentials (HTTP {response.status_code})")
        if 400 <= response.status_code < 500 and response.status_code != 404 and not _is_json(response):
            # A refusal in plain text (a gateway's or proxy's: vmauth, nginx; VictoriaMetrics' 429
            # when -search.maxConcurrentRequests are busy; its query errors and Prometheus' are JSON,
            # read by decode_vector): its words go to MetricsAvailable and its event, not "invalid JSON".
            try:
                text = response.read()[:300].decode(errors="replace")
            finally:
                response.close()
            raise SourceUnavailable(f"Prometheus refused the query (HTTP {response.status_code}): {text}")
        if response.status_code >= 500 or response.status_code == 404:
            try:
                text = response.read()[:200].decode(errors="replace")
            finally:
                response.close()
            raise SourceUnavailable(f"Prometheus answered HTTP {response.status_code}: {text}")
        return response

    def exchange(self, text: str, at: float | None, read: Callable[[Iterator[bytes]], _T]) -> _T:
        """Send one query and ``read`` its body (chunks as they arrive, gzip undone), all by the
        wall-clock deadline ``queryTimeout`` (see ``sources/metrics/deadline.py``); SourceUnavailable when
        it passes or the transport fails. Chunks are not re-cut to a size: httpx's re-chunking
        copies every byte once more (3x the read time of a 70 MB answer; bench/README.md)."""
        with deadline(self.config.timeout) as limit:
            try:
                response = self._request(text, at, limit)
                try:
                    return read(response.iter_bytes())
                finally:
                    response.close()
            except (httpx.HTTPError, httpx.StreamError, OSError, SourceUnavailable) as exc:
                if limit.expired or time.monotonic() >= limit.end:
                    raise SourceUnavailable(
                        f"Prometheus at {self.config.url} did not answer within {limit.seconds:g}s ({exc})"
                    ) from exc
                if isinstance(exc, SourceUnavailable):
                    raise
                raise SourceUnavailable(
                    f"reading from Prometheus at {self.config.url} failed: {exc}"
                ) from exc

    def query(self, text: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Run one instant query; SourceUnavailable on any transport, auth or PromQL error, or
        when the answer holds more than ``max_series`` series."""
        series = self.exchange(text, at, lambda chunks: decode_vector(b"".join(chunks)))
        check_cap(len(series), self.config.max_series)
        return series
