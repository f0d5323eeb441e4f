"""API failures that leave a write's outcome unknown, and what to count then.

A write the API server committed can still fail on the client's side: a 5xx from a proxy or an
aggregated server after etcd took it (504 Gateway Timeout), a read timeout, a connection reset
after the request was sent. Counted as "not done", such a write escapes every budget and its undo
record is rolled back while the owner stays at zero. So these failures are told apart from the ones
that surely changed nothing (a 4xx, or a connection that never opened), and the writer re-reads
the object before deciding; when even that fails, the outcome is UNKNOWN, which counts as done for
every budget (safety rule 11 in docs/safety.md).
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError


def outcome_unknown(exc: BaseException) -> str:
    """Why a failed write may have been applied all the same ('' when it surely was not)."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".rstrip() if (exc.status or 0) >= 500 else ""
    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, ConnectTimeoutError):  # includes NewConnectionError: nothing was sent
        return ""
    if isinstance(exc, (ReadTimeoutError, ProtocolError, TimeoutError, ConnectionResetError)):
        return f"{type(exc).__name__}: {exc}"
    return ""


def describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
