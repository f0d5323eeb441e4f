"""Instant-query answers decoded: whole (``decode_vector``) or streamed a chunk at a time
(``iter_vector``), with orjson because decoding dominates at thousands of GPUs (see
bench/engine_bench.py). Anything malformed is SourceUnavailable."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from gpu_efficiency.sources.metrics.base import SourceUnavailable

NAN = math.nan


def decode_result(body: bytes, kind: str) -> list[Any]:
    """The ``result`` list of a complete, successful answer of ``kind`` (vector, matrix);
    SourceUnavailable on invalid JSON, an error, a partial answer or another kind."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SourceUnavailable(f"Prometheus returned invalid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error", "unknown error") if isinstance(doc, dict) else "not an object"
        raise SourceUnavailable(f"Prometheus query failed: {error}")
    if doc.get("isPartial") is True:
        raise SourceUnavailable(PARTIAL)
    data = doc.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != kind:
        found = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise SourceUnavailable(f"Prometheus returned {found!r}, expected a {kind}")
    result = data.get("result", ())
    if not isinstance(result, list | tuple):
        raise SourceUnavailable(f"Prometheus returned a {type(result).__name__} result, expected a list")
    return list(result)


def decode_vector(body: bytes) -> list[tuple[dict[str, str], float]]:
    """Decode an instant-query response into (labels, value) pairs; raise on an error response."""
    result = decode_result(body, "vector")
    out: list[tuple[dict[str, str], float]] = []
    for item in result:
        labels = item.get("metric", {}) if isinstance(item, dict) else None
        if not isinstance(labels, dict) or not all(type(v) is str for v in labels.values()):
            raise SourceUnavailable(f"Prometheus returned a malformed series: {str(item)[:200]}")
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            value = NAN
        out.append((labels, value))
    return out


#: VictoriaMetrics answers from the vmstorage nodes it reached when one is down (its default
#: ``-search.denyPartialResponse=false``): missing series read as missing data, never as idle.
PARTIAL = (
    "Prometheus answered a partial result (isPartial: a VictoriaMetrics storage node unreachable): "
    "nothing is judged from it"
)

#: Window responses are decoded this many bytes of JSON at a time (see ``iter_vector``).
CHUNK_BYTES = 1 << 20
_VECTOR_HEAD = b'{"status":"success","data":{"resultType":"vector","result":['
#: VictoriaMetrics' complete answer: streamed like Prometheus'.
_VM_HEAD = b'{"status":"success","isPartial":false,"data":{"resultType":"vector","result":['
#: Its partial answer: refused at its first bytes (reading a 60 MB one whole to find this took the
#: operator to a 710 MiB peak at 8,000 GPUs).
_VM_PARTIAL_HEAD = b'{"status":"success","isPartial":true'
_SERIES_BOUNDARY = b'},{"metric":'  # cannot occur inside a JSON string: its quote is not escaped
_VALUE_KEY = b'"value":['


def iter_vector(chunks: Iterable[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[Any]]:
    """The result items (``{"metric": ..., "value": [t, "v"]}``) of an instant-query response read
    from ``chunks`` (the HTTP stream), about a MB of JSON at a time.

    A window response at 8,000 GPUs is ~70 MB of JSON and ~500 MB as Python objects; cut at series
    boundaries, only one chunk's objects exist at a time, and the body is never held whole.
    Anything but a plain success vector is read whole and goes through ``decode_vector`` (same
    errors, same result).
    """
    stream = iter(chunks)
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) >= len(_VM_HEAD) + 1:
            break
    if buf.startswith(_VM_PARTIAL_HEAD):
        raise SourceUnavailable(PARTIAL)
    head = next((h for h in (_VECTOR_HEAD, _VM_HEAD) if buf.startswith(h)), None)
    if head is None:
        yield _whole(buf, stream)
        return
    start = len(head)
    for chunk in stream:
        buf += chunk
        if len(buf) - start < chunk_bytes:
            continue
        cut = buf.rfind(_SERIES_BOUNDARY, start)
        if cut > start:
            try:
                items = orjson.loads(b"[" + buf[start : cut + 1] + b"]")
            except orjson.JSONDecodeError as exc:  # the boundary's text nested inside a series
                raise SourceUnavailable(f"Prometheus returned a malformed vector: {exc}") from exc
            yield items
            del buf[: cut + 2]
            start = 0
    # The last series ends at the first "]}" after its "value":[ (a [time, "number"] pair); the
    # result array and the data object close right after it (warnings may follow).
    if buf[start : start + 1] == b"]":
        return
    value = buf.find(_VALUE_KEY, buf.rfind(_SERIES_BOUNDARY, start) + 1 if start < len(buf) else start)
    end = buf.find(b"]}", value) + 2 if value >= 0 else -1
    if value < 0 or end < 2 or buf[end : end + 2] != b"]}":
        raise SourceUnavailable("Prometheus returned a truncated or malformed vector")
    try:
        yield orjson.loads(b"[" + buf[start:end] + b"]")
    except orjson.JSONDecodeError as exc:
        raise SourceUnavailable(f"Prometheus returned invalid JSON: {exc}") from exc


def _whole(head: bytearray, rest: Iterator[bytes]) -> list[Any]:
    body = bytes(head) + b"".join(rest)
    return [{"metric": labels, "value": (0, value)} for labels, value in decode_vector(body)]


def check_cap(series: int, cap: int) -> None:
    if cap > 0 and series > cap:
        raise SourceUnavailable(
            f"Prometheus answered more than {cap} series (--prometheus-max-series): forged or "
            "duplicated series? Nothing is judged from a partial answer"
        )
