"""The warning's Slack buttons and the message that replaces it after a click (slackapp/buttons.py):
Block Kit structure and limits, the token in every value, and every value escaped for Slack."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_efficiency.slackapp.buttons import (
    ACTIONS_BLOCK_ID,
    RELEASE_ACTION,
    actions_block,
    answered,
    parse_action,
    who,
    with_buttons,
)

TOKEN = "eyJuIjoidGVhbS1hIn0.c2lnbmF0dXJl"
MESSAGE: dict[str, Any] = {
    "text": "GPU about to be reclaimed: team-a/nb-0.",
    "blocks": [
        {"type": "header", "text": {"type": "plain_text", "text": "GPU about to be reclaimed: team-a/nb-0"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*What:* ..."}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "gpu-efficiency-operator · policy p"}]},
    ],
}


def test_one_keep_button_per_allowed_choice_then_release_each_carrying_the_token() -> None:
    block = actions_block(TOKEN, ("1h", "2h", "4h"))
    assert block is not None
    assert block["type"] == "actions"
    assert block["block_id"] == ACTIONS_BLOCK_ID
    elements = block["elements"]
    assert [e["text"]["text"] for e in elements] == [
        "Keep for 1h",
        "Keep for 2h",
        "Keep for 4h",
        "Release now",
    ]
    assert [e["action_id"] for e in elements] == [
        "gpuefficiency.keep.1h", "gpuefficiency.keep.2h", "gpuefficiency.keep.4h", RELEASE_ACTION,
    ]  # fmt: skip
    assert all(e["type"] == "button" and e["value"] == TOKEN for e in elements)
    assert all(e["text"]["type"] == "plain_text" and len(e["text"]["text"]) <= 75 for e in elements)
    assert len({e["action_id"] for e in elements}) == len(elements)  # Slack: unique in a message
    assert elements[0]["style"] == "primary"
    assert elements[-1]["style"] == "danger"
    confirm = elements[-1]["confirm"]
    assert {k: confirm[k]["type"] for k in ("title", "text", "confirm", "deny")} == dict.fromkeys(
        ("title", "text", "confirm", "deny"), "plain_text"
    )


def test_a_policy_without_keep_gets_only_release() -> None:
    block = actions_block(TOKEN, ())
    assert block is not None
    assert [e["action_id"] for e in block["elements"]] == [RELEASE_ACTION]


def test_no_buttons_without_a_token_or_with_one_too_long_for_slack() -> None:
    assert actions_block("", ("1h",)) is None
    assert actions_block("x" * 2001, ("1h",)) is None
    assert with_buttons(MESSAGE, "", ("1h",)) == MESSAGE


def test_at_most_25_elements() -> None:
    block = actions_block(TOKEN, tuple(f"{h}h" for h in range(1, 40)))
    assert block is not None
    assert len(block["elements"]) == 25
    assert block["elements"][-1]["action_id"] == RELEASE_ACTION


def test_the_buttons_go_after_the_text_and_before_the_context_line() -> None:
    message = with_buttons(MESSAGE, TOKEN, ("2h",))
    assert [b["type"] for b in message["blocks"]] == ["header", "section", "actions", "context"]
    assert message["text"] == MESSAGE["text"]
    assert len(MESSAGE["blocks"]) == 3  # the original is not changed


@pytest.mark.parametrize(
    ("action_id", "expected"),
    [
        ("gpuefficiency.keep.2h", ("keep", "2h")),
        ("gpuefficiency.keep.1h30m", ("keep", "1h30m")),
        ("gpuefficiency.release", ("release", "")),
        ("gpuefficiency.keep.", None),
        ("gpuefficiency.keep.forever", None),
        ("gpuefficiency.keep.2h;rm", None),
        ("gpuefficiency.delete", None),
        ("", None),
    ],
)
def test_parse_action(action_id: str, expected: tuple[str, str] | None) -> None:
    assert parse_action(action_id) == expected


def test_who_mentions_a_real_user_id_and_escapes_anything_else() -> None:
    assert who({"id": "U0123ABC", "username": "alice"}) == "<@U0123ABC>"
    assert who({"id": "<!channel>", "username": "<!here>&"}) == "&lt;!here&gt;&amp;"
    assert who({}) == "someone"


def test_the_answer_replaces_the_original_without_buttons_and_says_what_happened() -> None:
    original = with_buttons(MESSAGE, TOKEN, ("2h",))
    reply = answered(original, "GPU kept for 2h", True, "<@U0123ABC>")
    assert reply["replace_original"] is True
    assert [b["type"] for b in reply["blocks"]] == ["header", "section", "context", "context"]
    assert TOKEN not in str(reply)
    line = reply["blocks"][-1]["elements"][0]
    assert line == {"type": "mrkdwn", "text": ":white_check_mark: GPU kept for 2h (clicked by <@U0123ABC>)"}
    assert reply["text"].startswith(MESSAGE["text"])


def test_the_outcome_is_escaped_in_the_answer() -> None:
    reply = answered(MESSAGE, "the pod <!channel> & <https://x|y> is gone", False, "someone")
    text = reply["blocks"][-1]["elements"][0]["text"]
    assert text.startswith(":warning: the pod &lt;!channel&gt; &amp; &lt;https://x|y&gt; is gone")
    assert "<!channel>" not in str(reply)
    assert "<https" not in str(reply)


def test_a_huge_outcome_is_cut_to_slack_s_limit() -> None:
    reply = answered(MESSAGE, "x" * 5000, False, "someone")
    assert len(reply["blocks"][-1]["elements"][0]["text"]) <= 3000
    assert len(reply["text"]) <= 3000
