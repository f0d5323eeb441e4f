"""Go-style durations in policy fields ("90s", "1h30m"): the units CEL's duration() accepts.

A spec field is a ``Duration``: the string the admin wrote (what the CRD stores and the API serves
back, unchanged) that also knows its seconds, parsed once when the spec is validated; the engine
reads ``.seconds`` and never parses a string again.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic stays out of the node agent, which parses its flags here
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

#: The form of every duration field; the CRD generator appends a note to each such field's own
#: description (``api/crd.py``).
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"

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


class Duration(str):
    """A Go duration string that exposes its length: ``Duration("1h30m").seconds == 5400.0``."""

    seconds: float

    def __new__(cls, text: str) -> Duration:
        value = super().__new__(cls, text)
        value.seconds = parse_duration(text)
        return value

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """On the wire a plain string with the pattern (the CRD's schema is unchanged); in Python
        a ``Duration``, serialised back as the string it was given."""
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(pattern=DURATION_PATTERN),
            serialization=core_schema.plain_serializer_function_ser_schema(str, when_used="json"),
        )
