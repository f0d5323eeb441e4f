"""The HTTP exchange with Prometheus: one instant query per POST, its answer read by a deadline.

One ``requests`` session per source (connection pool, connection retries, TLS trust); bearer token
and basic-auth secrets are read from files at each query so they can rotate without a restart.
Each exchange is bounded by a wall-clock deadline (``sources/deadline.py``): a trickled body is cut
off, not waited for. Readers get the body as an iterator of byte chunks, never the response, so the
decoding (``vector.py``, ``windows.py``) knows nothing of the HTTP stack.

The agent source speaks httpx; this client stays on ``requests`` (a declared dependency) because
its deadline, streaming and retry behaviour is what the tests against slow and trickling servers
pin down (``tests/unit/sources/test_fetch_deadlines.py``); ``exchange`` is the seam a move to httpx
would replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import requests
from urllib3.util.retry import Retry

from gpu_efficiency.sources.base import SourceUnavailable
from gpu_efficiency.sources.deadline import Deadline, deadline, requests_fileno
from gpu_efficiency.sources.prometheus.vector import CHUNK_BYTES, check_cap, decode_vector

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


class PrometheusClient:
    """Instant queries against one Prometheus, each by the wall-clock deadline ``config.timeout``."""

    def __init__(self, config: PrometheusConfig) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        session = requests.Session()
        # Failed connections are retried; answers are not: urllib3 retries no POST on a status or a
        # broken read, and an error answer is reported at once (the next cycle asks again). Until
        # this client, a Retry that also retried POSTs on 502/503/504 was declared here, but
        # prometheus-api-client's constructor mounted its own adapter over it (3 connection retries,
        # no POST retries), and that one ran: its behaviour is kept, with the declared count.
        retry = Retry(total=config.retries, backoff_factor=0.2, status_forcelist=())
        session.mount(config.url, requests.adapters.HTTPAdapter(max_retries=retry))
        if config.ca_file:
            session.verify = config.ca_file
        elif config.insecure_skip_verify:
            session.verify = False
        self._session = session

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

    def _request(self, text: str, at: float | None, limit: Deadline) -> requests.Response:
        """POST one instant query, streamed, its socket held by ``limit``; SourceUnavailable on
        transport, auth or HTTP errors (PromQL errors are found when the body is decoded)."""
        body = "query=" + form_value(text) + ("" if at is None else f"&time={at:.3f}")
        try:
            response = self._session.post(
                f"{self.url}/api/v1/query",
                data=body.encode(),
                headers={**self.headers(), "Content-Type": FORM},
                auth=self.auth(),
                timeout=limit.remaining(),
                stream=True,
            )
        except (requests.RequestException, OSError) as exc:
            raise SourceUnavailable(f"Prometheus at {self.config.url} unreachable: {exc}") from exc
        limit.hold_fileno(requests_fileno(response))
        if response.status_code in (401, 403):
            response.close()
            raise SourceUnavailable(f"Prometheus refused the credentials (HTTP {response.status_code})")
        if response.status_code >= 500 or response.status_code == 404:
            text = response.text[:200]
            response.close()
            raise SourceUnavailable(f"Prometheus answered HTTP {response.status_code}: {text}")
        return response

    def exchange(self, text: str, at: float | None, read: Callable[[Iterator[bytes]], _T]) -> _T:
        """Send one query and ``read`` its body (chunks of up to ``CHUNK_BYTES``), all by the
        wall-clock deadline ``queryTimeout`` (see ``sources/deadline.py``); SourceUnavailable when
        it passes or the transport fails."""
        with deadline(self.config.timeout) as limit:
            try:
                response = self._request(text, at, limit)
                try:
                    return read(response.iter_content(CHUNK_BYTES))
                finally:
                    response.close()
            except (requests.RequestException, OSError, SourceUnavailable) as exc:
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
