"""The wire formats of a notification, beside the code that posts them (``delivery``): CloudEvents
1.0 in structured mode and Slack incoming-webhook JSON (Block Kit). Pure: a ``Notification`` (the
engine's decision of what to announce) in, a JSON-ready dict out.
"""

from __future__ import annotations

from typing import Any

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.timefmt import format_rfc3339, format_when
from gpu_efficiency.engine import NOTIFICATION_TITLES as TITLES
from gpu_efficiency.engine import Notification

#: CloudEvents ``type`` prefix (reverse DNS of the API group); the event reason follows.
CLOUDEVENT_TYPE_PREFIX = "io.gpuefficiency."
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
#: Slack Block Kit limits (https://api.slack.com/reference/block-kit/blocks).
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000
SLACK_FIELD_MAX = 2000


def cloudevent(n: Notification) -> dict[str, Any]:
    """CloudEvents 1.0 in structured mode (the whole event is the JSON body)."""
    data: dict[str, Any] = {
        "reason": n.reason,
        "eventType": n.type,
        "message": n.message,
        "why": n.why,
        "policy": n.policy,
        "namespace": n.namespace or None,
        "kind": n.kind,
        "name": n.name,
        "uid": n.uid,
        "pod": n.pod or None,
        "owner": n.owner or None,
        "node": n.node or None,
        "gpus": list(n.gpus),
        "verdict": n.verdict or None,
        "diagnosis": n.diagnosis or None,
        "idleSince": format_rfc3339(n.idle_since) if n.idle_since is not None else None,
        "deadline": format_rfc3339(n.deadline) if n.deadline is not None else None,
        "acknowledge": n.acknowledge or None,
        "restore": n.restore or None,
        "selfService": n.link or None,
    }
    return {
        "specversion": "1.0",
        "id": n.id,
        "source": f"/apis/{GROUP}/{VERSION}/{PLURAL}/{n.policy}",
        "type": CLOUDEVENT_TYPE_PREFIX + n.reason,
        "time": format_rfc3339(n.time),
        "subject": n.subject,
        "datacontenttype": "application/json",
        "data": data,
    }


def _cut(text: str, limit: int) -> str:
    """``text`` (escaped for Slack) within ``limit``, never cut inside an ``&amp;`` entity."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    amp = head.rfind("&")
    if amp >= 0 and ";" not in head[amp:]:
        head = head[:amp]
    return head + "…"


def slack_escape(value: str) -> str:
    """Slack parses ``&``, ``<`` and ``>`` in message text and text objects (``<!channel>``,
    ``<https://...|Click here>``); its formatting reference asks for exactly these three to be sent
    as HTML entities. Names come from ownerReferences and annotations a tenant writes, so every
    value put into a Slack message is escaped (our own text uses none of the three on purpose)."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain_message(n: Notification) -> str:
    """The event message without its evidence (the numbers are in the fields below it)."""
    text = n.message
    for marker in (". Evidence:", "; evidence:", ". Idle since"):
        cut = text.find(marker)
        if cut > 0:
            text = text[:cut]
    return text.rstrip(". ") + "."


def slack_message(n: Notification) -> dict[str, Any]:
    """A Slack incoming-webhook message: what, why in plain words, when, how to keep it. Every
    value is escaped (``slack_escape``) before it is cut to Slack's limits."""
    esc = slack_escape
    title = esc(f"{TITLES.get(n.reason, n.reason)}: {n.target}")
    lines = [f"*What:* {esc(_plain_message(n))}", f"*Why:* {esc(n.why)}."]
    if n.deadline is not None:
        lines.append(f"*When:* {format_when(n.deadline, n.time)}")
    if n.link:
        lines.append(f"*Keep it or give it back:* <{esc(n.link)}|open the page>")
    if n.acknowledge:
        lines.append(f"*Keep it:* run `{esc(n.acknowledge)}`")
    if n.restore:
        lines.append(f"*Undo:* {esc(n.restore)}")
    facts = [
        ("Namespace", n.namespace),
        ("Pod", n.pod),
        ("Owner", n.owner),
        ("Node", n.node),
        ("GPU", ", ".join(n.gpus)),
        ("Diagnosis", n.diagnosis),
    ]
    fields = [{"type": "mrkdwn", "text": _cut(f"*{k}*\n{esc(v)}", SLACK_FIELD_MAX)} for k, v in facts if v]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, SLACK_HEADER_MAX)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut("\n".join(lines), SLACK_TEXT_MAX)}},
    ]
    if fields:
        blocks.append({"type": "section", "fields": fields[:10]})
    blocks.append(
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": esc(f"gpu-efficiency-operator · policy {n.policy} · {n.reason}")}
            ],
        }
    )
    text = f"{title}. {esc(_plain_message(n))}"
    tail = f" To keep it: {esc(n.acknowledge)}" if n.acknowledge else ""
    message: dict[str, Any] = {"text": _cut(text, SLACK_TEXT_MAX - len(tail)) + tail, "blocks": blocks}
    if n.channel:
        message["channel"] = n.channel
    return message
