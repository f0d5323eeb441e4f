"""Extra HTTP headers for every Prometheus query (``--prometheus-headers``): parsed and checked
here, beside the settings, so a bad pair stops the process at start-up.

Multi-tenant PromQL stores pick the tenant from a header: Grafana Mimir and Cortex answer HTTP 401
"no org id" to a query without ``X-Scope-OrgID``, and Thanos Query behind a tenancy proxy reads
``THANOS-TENANT``. The operator sends the headers an administrator names, as ``Name: value`` pairs,
with every query to the URLs its credentials may go to
(``sources/metrics/prometheus/credentials.py``): a header may carry an
API key, so a policy naming another URL does not get them.

A bad pair is refused at start-up with the setting's name, never sent: a name that is not an HTTP
token, a value with a line break (header injection), a name given twice, or a header the client
sets itself (``Authorization`` comes from the bearer-token and basic-auth files, which can rotate).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: RFC 9110 section 5.6.2: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: RFC 9110 section 5.5: visible ASCII, space and tab (obsolete non-ASCII text is not accepted here).
_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: Headers the client writes itself: set here they would be overwritten or contradict the request.
RESERVED = frozenset(
    {
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "host",
        "transfer-encoding",
    }
)


class HeaderError(ValueError):
    """A ``Name: value`` pair that cannot be sent as it is."""


def parse_headers(pairs: Iterable[str]) -> dict[str, str]:
    """``Name: value`` pairs as a header map (names as given, values stripped); HeaderError names
    the first pair that cannot be sent and why."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for pair in pairs:
        name, colon, value = pair.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not name:
            raise HeaderError(f"{pair!r} is not 'Name: value'")
        if not _TOKEN.fullmatch(name):
            raise HeaderError(f"{name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        if not _VALUE.fullmatch(value):
            raise HeaderError(
                f"the value of {name} holds a line break or a character outside printable ASCII"
            )
        lowered = name.lower()
        if lowered in RESERVED:
            raise HeaderError(
                f"{name} is set by the operator itself"
                + (": use the bearer-token or basic-auth file" if lowered == "authorization" else "")
            )
        if lowered in seen:
            raise HeaderError(f"{name} is given twice")
        seen.add(lowered)
        out[name] = value
    return out
