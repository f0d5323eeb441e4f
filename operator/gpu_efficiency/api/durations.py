"""Parse the Go-style durations used in policy fields ("90s", "1h30m"): the units CEL's duration() accepts."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Return seconds; raise ValueError with the offending text on anything else."""
    text = text.strip()
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"invalid duration {text!r}: use forms like 30s, 5m, 1h30m")
    return total


def format_duration(seconds: float) -> str:
    """Shortest readable form, for messages ("1h5m", "45s")."""
    left = round(seconds)
    if left <= 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)
