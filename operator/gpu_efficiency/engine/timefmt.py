"""RFC3339 formatting and parsing of the times kept in annotations and status (pure, UTC)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime


def format_rfc3339(ts: float) -> str:
    """Unix seconds as RFC3339 UTC with seconds precision and a 'Z' suffix (what Kubernetes writes)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.floor(ts)))


def parse_rfc3339(text: str | None) -> float | None:
    """Unix seconds, or None when the text is missing or not a valid timestamp.

    Accepts 'Z' or numeric offsets and fractional seconds; a time without offset is taken as UTC.
    Returning None (not raising) lets callers treat a user's malformed annotation as absent.
    """
    if not text:
        return None
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
