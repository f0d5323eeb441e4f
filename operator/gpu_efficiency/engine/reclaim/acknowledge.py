"""The one-line acknowledgement: ``gpuefficiency.io/keep-for=4h`` on a pod keeps its GPU.

A relative duration, so nobody has to write an RFC 3339 timestamp under pressure. It counts from
when the operator first saw it (``keep-until-seen``, which the idle ledger protects from edits) and
is bounded by the policy's ``maxKeep``, so it cannot hold a GPU for ever. Every warning ends with
the exact command, written here once.
"""

from __future__ import annotations

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration, parse_duration

#: What the acknowledge command asks for, unless the policy's maxKeep is shorter.
KEEP_FOR_DEFAULT_S = 4 * 3600.0
#: Kubernetes keeps at most this much of an event's message.
EVENT_MESSAGE_LIMIT = 1024


def parse_keep_for(text: str) -> float:
    """Seconds of a keep-for value; ValueError saying what is wrong and what to write instead."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ValueError(
            f"{names.KEEP_FOR}={text!r} is not a duration: write it like 4h, 90m or 1h30m"
        ) from None
    if seconds <= 0:
        raise ValueError(f"{names.KEEP_FOR}={text!r} keeps nothing: write a duration longer than 0s, like 4h")
    return seconds


def keep_for_value(max_keep_s: float) -> str:
    """The duration the acknowledge command asks for: 4h, or maxKeep when that is shorter."""
    return format_duration(min(KEEP_FOR_DEFAULT_S, max_keep_s))


def keep_command(namespace: str, pod: str, max_keep_s: float) -> str:
    """The exact line that keeps a warned pod's GPU (every warning ends with it)."""
    return (
        f"kubectl annotate pod {pod} -n {namespace} {names.KEEP_FOR}={keep_for_value(max_keep_s)} --overwrite"
    )


def ending_with(text: str, tail: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """``text`` followed by ``tail``, the text shortened (never the tail) to fit ``limit``."""
    room = limit - len(tail)
    if len(text) > room:
        text = text[: max(0, room - 1)] + "…"
    return text + tail
