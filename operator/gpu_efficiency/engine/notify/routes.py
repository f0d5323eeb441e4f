"""Which webhook a namespace's Slack messages go to.

A Slack app's incoming webhook posts to the one channel it was created for and ignores a
``channel`` field, so the ``notify-channel`` annotation routes nothing there. A team gets its own
channel by its own webhook instead: the namespace annotation ``slack-url-secret-key`` names a key
of the notify Secret the chart mounts (the same Secret, read the same way as the sinks' own
``urlSecretKey``: the operator still reads no Secrets through the API). A namespace without it, or
with a value that cannot be a Secret key, goes to the sink's own webhook; a bad value is reported,
never followed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import NotifySink, SinkType
from gpu_efficiency.engine.model import NamespaceView

#: A Secret data key as Kubernetes validates it (IsConfigMapKey): these characters, at most 253,
#: not "." or "..", and not starting with ".." (the kubelet's own ``..data`` entries in the mount).
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def secret_key_problem(value: str) -> str:
    """Why ``value`` cannot name a key of the mounted Secret ('' when it can)."""
    if not value:
        return "it is empty"
    if not _SECRET_KEY.match(value):
        return "a Secret key has only letters, digits, '-', '_' and '.' (at most 253)"
    if value in (".", "..") or value.startswith(".."):
        return "a Secret key is not '.' or '..' and does not start with '..'"
    return ""


@dataclass(frozen=True, slots=True)
class SlackRoutes:
    """Namespace -> key of its own Slack webhook, and namespace -> why its annotation is ignored."""

    keys: Mapping[str, str]
    invalid: Mapping[str, str]


def slack_routes(namespaces: Iterable[NamespaceView]) -> SlackRoutes:
    """Each namespace's Slack webhook key, from its ``slack-url-secret-key`` annotation."""
    keys: dict[str, str] = {}
    invalid: dict[str, str] = {}
    for ns in namespaces:
        raw = ns.annotations.get(names.SLACK_URL_SECRET_KEY)
        if raw is None:
            continue
        value = raw.strip()
        problem = secret_key_problem(value)
        if problem:
            shown = value if len(value) <= 64 else value[:63] + "…"
            invalid[ns.name] = (
                f"{names.SLACK_URL_SECRET_KEY}={shown!r} is ignored ({problem}); its Slack messages "
                "go to the sink's own webhook"
            )
        else:
            keys[ns.name] = value
    return SlackRoutes(keys, invalid)


def route_problems(
    routes: SlackRoutes, sinks: Sequence[NotifySink], namespaces: Iterable[str]
) -> dict[str, str]:
    """Namespace -> why its annotation is ignored, for the ``namespaces`` (those the policy judged)
    that one of its Slack sinks may post about: another policy's tenants are not this one's concern."""
    slack = [s for s in sinks if s.type is SinkType.SLACK]
    return {
        ns: routes.invalid[ns]
        for ns in sorted(set(namespaces))
        if ns in routes.invalid and any(not s.namespaces or ns in s.namespaces for s in slack)
    }
