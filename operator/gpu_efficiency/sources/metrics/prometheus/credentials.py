"""Which Prometheus URLs may receive the operator's credentials (issue 19, finding 5).

A policy may name its own Prometheus (``spec.metrics.prometheus.url``), and anyone who may write a
policy may name any URL: the operator's bearer token or basic auth would then go to a server of
their choosing. Credentials are sent only to URLs under a prefix the operator's administrator
allowed (``--prometheus-credentials-for``, default: the operator's own ``--prometheus-url``).

A prefix is compared as a URL, not as text: scheme, host and port must be equal and the path must
start with the prefix's path at a segment boundary, so ``http://prom:9090`` allows neither
``http://prom:9090.evil.example`` nor ``http://prom:9090@evil.example``.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parts(url: str) -> tuple[str, str, int, str] | None:
    try:
        split: SplitResult = urlsplit(url.strip())
        port = split.port
    except ValueError:
        return None
    scheme = split.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not split.hostname or split.username is not None:
        return None
    return scheme, split.hostname.lower(), port or _DEFAULT_PORTS[scheme], split.path.rstrip("/")


def credentials_allowed(url: str, prefixes: Iterable[str]) -> bool:
    """True when ``url`` lies under one of ``prefixes`` (see the module docstring)."""
    target = _parts(url)
    if target is None:
        return False
    for prefix in prefixes:
        allowed = _parts(prefix)
        if allowed is None or allowed[:3] != target[:3]:
            continue
        if target[3] == allowed[3] or target[3].startswith(allowed[3] + "/"):
            return True
    return False
