"""RFC3339 formatting and parsing of the times kept in annotations and status (pure, UTC)."""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: Times kept per cache: every cycle re-reads and re-writes the same idle clocks and warnings
#: (a few per pod), so parsing and formatting them once per process saves the engine's CPU at
#: thousands of pods; beyond this many distinct times the oldest are recomputed.
_CACHED_TIMES = 32768
#: Longest text whose parse is kept ('2026-11-27T10:15:00.123456789+00:00' is 35 characters).
_CACHED_TEXT = 64


def format_rfc3339(ts: float | datetime) -> str:
    """Unix seconds (or a datetime, naive meaning UTC, as the Kubernetes client returns them) as
    RFC3339 UTC with seconds precision and a 'Z' suffix (what Kubernetes writes)."""
    if isinstance(ts, datetime):
        return (ts if ts.tzinfo is None else ts.astimezone(UTC)).strftime(_FORMAT)
    return _format_whole(math.floor(ts))


@functools.lru_cache(maxsize=_CACHED_TIMES)
def _format_whole(seconds: int) -> str:
    return time.strftime(_FORMAT, time.gmtime(seconds))


def parse_rfc3339(text: str | None) -> float | None:
    """Unix seconds, or None when the text is missing or not a valid timestamp.

    Accepts 'Z' or numeric offsets and fractional seconds; a time without offset is taken as UTC.
    Returning None (not raising) lets callers treat a user's malformed annotation as absent.
    """
    if not text:
        return None
    if len(text) > _CACHED_TEXT:  # no timestamp is this long: not kept (a user's text may be huge)
        return _parse.__wrapped__(text)
    return _parse(text)


@functools.lru_cache(maxsize=_CACHED_TIMES)
def _parse(text: str) -> float | None:
    text = text.strip()
    if text[-1:] in ("z", "Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_relative(ts: float, now: float) -> str:
    """How far ``ts`` is from ``now`` as people say it: 'in 14m', '5m ago', 'now' (whole minutes
    from one minute on, so a message read a few seconds later is not visibly wrong)."""
    from gpu_efficiency.api.durations import format_duration

    delta = ts - now
    seconds = abs(delta)
    if seconds < 1:
        return "now"
    amount = format_duration(round(seconds / 60) * 60 if seconds >= 60 else math.floor(seconds))
    return f"in {amount}" if delta > 0 else f"{amount} ago"


def format_when(ts: float, now: float) -> str:
    """RFC3339 (what annotations hold, unambiguous in every time zone) with the relative time, so a
    researcher need not convert UTC: '2026-11-27T10:15:00Z (in 14m)'."""
    return f"{format_rfc3339(ts)} ({format_relative(ts, now)})"
