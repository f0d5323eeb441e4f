"""The Keep for / Release now buttons of a Slack warning, and the message that replaces it after a
click. Pure: Block Kit JSON in, Block Kit JSON out.

Each button's ``value`` is the warning's signed self-service token (the one in the page link), so a
click proves what the link proves (this pod, this policy, until this deadline) and nothing more; the
``action_id`` says which button (``gpuefficiency.keep.2h``, ``gpuefficiency.release``). The endpoint
re-checks the duration against the policy, so a forged ``action_id`` grants nothing more either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpu_efficiency.actuators.notify.wire import slack_escape

ACTIONS_BLOCK_ID = "gpuefficiency-actions"
KEEP_PREFIX = "gpuefficiency.keep."
RELEASE_ACTION = "gpuefficiency.release"
#: Block Kit limits (https://api.slack.com/reference/block-kit/block-elements#button): a button's
#: value at most 2000 characters; an actions block at most 25 elements.
VALUE_MAX = 2000
ELEMENTS_MAX = 25
#: The outcome is a context block's mrkdwn text (at most 3000 characters).
OUTCOME_MAX = 3000
_DURATION = re.compile(r"^[0-9]+(h|m|s)([0-9]+(m|s))?([0-9]+s)?$")
_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,20}$")


def actions_block(token: str, keep_choices: Sequence[str]) -> dict[str, Any] | None:
    """The buttons: one Keep for per choice the policy allows, then Release now (with a confirm
    dialog: it gives the GPU back at the next cycle). None when the token cannot be a button's value."""
    if not token or len(token) > VALUE_MAX:
        return None
    elements: list[dict[str, Any]] = [
        {
            "type": "button",
            "action_id": KEEP_PREFIX + choice,
            "text": {"type": "plain_text", "text": f"Keep for {choice}"},
            "value": token,
        }
        for choice in keep_choices[: ELEMENTS_MAX - 1]
    ]
    if elements:
        elements[0]["style"] = "primary"
    elements.append(
        {
            "type": "button",
            "action_id": RELEASE_ACTION,
            "text": {"type": "plain_text", "text": "Release now"},
            "style": "danger",
            "value": token,
            "confirm": {
                "title": {"type": "plain_text", "text": "Give the GPU back?"},
                "text": {
                    "type": "plain_text",
                    "text": "The workload is reclaimed at the operator's next cycle, "
                    "through the policy's usual action and budgets.",
                },
                "confirm": {"type": "plain_text", "text": "Release now"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            },
        }
    )
    return {"type": "actions", "block_id": ACTIONS_BLOCK_ID, "elements": elements}


def token_of(link: str) -> str:
    """The signed token of a self-service page link (its ``t`` query parameter), '' when none."""
    values = parse_qs(urlsplit(link).query).get("t") or [""]
    return values[0]


def with_buttons(message: Mapping[str, Any], token: str, keep_choices: Sequence[str]) -> dict[str, Any]:
    """``message`` with the buttons after its text (before the context line), when they fit."""
    block = actions_block(token, keep_choices)
    out = dict(message)
    if block is None:
        return out
    blocks = list(message.get("blocks") or [])
    at = len(blocks) - 1 if blocks and blocks[-1].get("type") == "context" else len(blocks)
    out["blocks"] = [*blocks[:at], block, *blocks[at:]]
    return out


def parse_action(action_id: str) -> tuple[str, str] | None:
    """("keep", "2h") or ("release", "") from a button's action_id; None for anything else."""
    if action_id == RELEASE_ACTION:
        return ("release", "")
    if action_id.startswith(KEEP_PREFIX):
        duration = action_id[len(KEEP_PREFIX) :]
        if _DURATION.match(duration):
            return ("keep", duration)
    return None


def who(user: Mapping[str, Any]) -> str:
    """A Slack mention of the user who clicked when their id looks like one, else their name, escaped."""
    uid = str(user.get("id") or "")
    if _USER_ID.match(uid):
        return f"<@{uid}>"
    return slack_escape(str(user.get("username") or user.get("name") or "someone"))[:80]


def answered(original: Mapping[str, Any], outcome: str, ok: bool, by: str) -> dict[str, Any]:
    """The message that replaces the warning after a click (``replace_original``): the warning's
    own blocks without the buttons, and one line saying what the click did and who clicked.
    ``outcome`` is plain words (escaped here); ``by`` is already Slack markup (``who``)."""
    blocks = [
        b
        for b in (original.get("blocks") or [])
        if isinstance(b, Mapping) and b.get("type") != "actions" and b.get("block_id") != ACTIONS_BLOCK_ID
    ]
    mark = ":white_check_mark:" if ok else ":warning:"
    line = f"{mark} {slack_escape(outcome)} (clicked by {by})"
    if len(line) > OUTCOME_MAX:
        line = line[: OUTCOME_MAX - 1] + "…"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": line}]})
    text = str(original.get("text") or "")
    return {
        "replace_original": True,
        "text": f"{text} {mark} {slack_escape(outcome)}"[:OUTCOME_MAX],
        "blocks": blocks[:50],
    }
