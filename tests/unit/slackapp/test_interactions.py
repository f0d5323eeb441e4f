"""The Slack interaction endpoint (slackapp/interactions.py): a click signed as Slack signs it
reaches the click module with the token's claims and the button's choice, and the original message
is replaced through response_url; anything not signed, not ours, or with a bad token changes nothing.

The click module itself (selfservice/clicks.py: leader only, idempotent, the event) is tested with
the page and, end to end with this endpoint, in tests/e2e/test_slack_actions_e2e.py; here a
recorder stands in for it so every refusal can be shown to reach no click at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from gpu_efficiency.selfservice.clicks import ClickOutcome, Keep, Release
from gpu_efficiency.selfservice.tokens import Claims
from gpu_efficiency.selfservice.tokens import sign as sign_token
from gpu_efficiency.slackapp.buttons import with_buttons
from gpu_efficiency.slackapp.interactions import SlackActions
from gpu_efficiency.slackapp.signature import sign

NOW = 1_800_000_000.0
SECRET = b"slack-signing-secret-0123456789"
KEY = b"k" * 32
CLAIMS = Claims("team-a", "nb-0", "uid-1", "p", int(NOW) + 600)
RESPONSE_URL = "https://hooks.slack.com/actions/T1/1/abc"
MESSAGE = {
    "text": "GPU about to be reclaimed: team-a/nb-0.",
    "blocks": [{"type": "header", "text": {"type": "plain_text", "text": "GPU about to be reclaimed"}}],
}


@dataclass
class Clicks:
    calls: list[tuple[Claims, Any, str, str]] = field(default_factory=list)
    outcome: ClickOutcome = field(default_factory=lambda: ClickOutcome(200, True, "GPU kept for 2h"))

    def __call__(self, claims: Claims, click: Any, *, remote: str, via: str) -> ClickOutcome:
        self.calls.append((claims, click, remote, via))
        return self.outcome


@dataclass
class Posts:
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, url: str, body: bytes, timeout: float) -> int:
        self.sent.append((url, json.loads(body)))
        return 200


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[SlackActions, Clicks, Posts]]:
    (tmp_path / "signing-secret").write_bytes(SECRET + b"\n")
    clicks, posts = Clicks(), Posts()
    actions = SlackActions(
        signing_secret_file=tmp_path / "signing-secret",
        token_key=lambda: KEY,
        apply_click=clicks,
        post=posts,
        clock=lambda: NOW,
    )
    yield actions, clicks, posts
    actions.stop()


def body(action_id: str = "gpuefficiency.keep.2h", token: str | None = None, **extra: Any) -> bytes:
    token = sign_token(KEY, CLAIMS) if token is None else token
    payload = {
        "type": "block_actions",
        "user": {"id": "U0123ABC", "username": "alice"},
        "response_url": RESPONSE_URL,
        "message": with_buttons(MESSAGE, token, ("2h",)),
        "actions": [{"action_id": action_id, "block_id": "gpuefficiency-actions", "value": token}],
        **extra,
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(raw: bytes, secret: bytes = SECRET, ts: float = NOW) -> dict[str, str]:
    stamp = str(int(ts))
    return {"x-slack-request-timestamp": stamp, "x-slack-signature": sign(secret, stamp, raw)}


def settle(actions: SlackActions) -> None:
    if actions.last_response is not None:
        actions.last_response.result(timeout=5)


def test_a_signed_keep_click_applies_and_replaces_the_message(
    endpoint: tuple[SlackActions, Clicks, Posts],
) -> None:
    actions, clicks, posts = endpoint
    raw = body()
    status, _, _ = actions(signed(raw), raw, "10.0.0.7")
    assert status == 200
    ((claims, click, remote, via),) = clicks.calls
    assert (claims, click, via) == (CLAIMS, Keep("2h"), "slack")
    assert remote == "Slack user U0123ABC (alice) via 10.0.0.7"
    settle(actions)
    ((url, reply),) = posts.sent
    assert url == RESPONSE_URL
    assert reply["replace_original"] is True
    assert [b["type"] for b in reply["blocks"]] == ["header", "context"]
    assert (
        reply["blocks"][-1]["elements"][0]["text"]
        == ":white_check_mark: GPU kept for 2h (clicked by <@U0123ABC>)"
    )


def test_release_reaches_the_click_module_as_release(endpoint: tuple[SlackActions, Clicks, Posts]) -> None:
    actions, clicks, _ = endpoint
    raw = body("gpuefficiency.release")
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 200
    assert clicks.calls[0][1] == Release()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-slack-request-timestamp": str(int(NOW))},
        "wrong-secret",
        "old",
        "future",
        "tampered",
    ],
)
def test_a_request_not_signed_by_slack_changes_nothing(
    endpoint: tuple[SlackActions, Clicks, Posts], headers: Any
) -> None:
    actions, clicks, posts = endpoint
    raw = body()
    if headers == "wrong-secret":
        headers = signed(raw, b"another-secret")
    elif headers == "old":
        headers = signed(raw, ts=NOW - 301)
    elif headers == "future":
        headers = signed(raw, ts=NOW + 301)
    elif headers == "tampered":
        headers = signed(raw)
        raw = body("gpuefficiency.release")
    status, _, text = actions(headers, raw, "10.0.0.7")
    assert status == 401, text
    assert text.startswith(b"not signed by Slack: ")
    assert clicks.calls == []
    assert posts.sent == []


def test_no_signing_secret_file_refuses_everything(tmp_path: Path) -> None:
    clicks = Clicks()
    actions = SlackActions(
        signing_secret_file=tmp_path / "absent", token_key=lambda: KEY, apply_click=clicks, clock=lambda: NOW
    )
    raw = body()
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 503
    assert clicks.calls == []
    actions.stop()


@pytest.mark.parametrize(
    "raw",
    [
        b"payload=not-json",
        b"",
        urlencode({"payload": json.dumps({"type": "view_submission"})}).encode(),
        urlencode({"payload": json.dumps([1, 2])}).encode(),
        body("gpuefficiency.keep.forever"),
        body("some.other.app"),
        body(actions=[]),
        body(response_url=None),
    ],
)
def test_a_signed_payload_that_is_not_our_button_is_refused(
    endpoint: tuple[SlackActions, Clicks, Posts], raw: bytes
) -> None:
    actions, clicks, posts = endpoint
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 400
    assert clicks.calls == []
    assert posts.sent == []


def test_a_tampered_or_expired_token_is_answered_in_slack_and_changes_nothing(
    endpoint: tuple[SlackActions, Clicks, Posts],
) -> None:
    actions, clicks, posts = endpoint
    good = sign_token(KEY, CLAIMS)
    expired = sign_token(KEY, Claims("team-a", "nb-0", "uid-1", "p", int(NOW) - 1))
    forged = sign_token(b"f" * 32, CLAIMS)
    for token in (good[:-2] + "AA", expired, forged):
        raw = body(token=token)
        assert actions(signed(raw), raw, "10.0.0.7")[0] == 200
        settle(actions)
    assert clicks.calls == []
    assert len(posts.sent) == 3
    for _, reply in posts.sent:
        assert reply["blocks"][-1]["elements"][0]["text"].startswith(":warning: this button no longer works")


def test_a_standby_s_try_again_keeps_the_buttons(endpoint: tuple[SlackActions, Clicks, Posts]) -> None:
    actions, clicks, posts = endpoint
    clicks.outcome = ClickOutcome(503, False, "this replica is on standby: try again in a few seconds")
    raw = body()
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 200
    settle(actions)
    ((_, reply),) = posts.sent
    assert reply == {"response_type": "ephemeral", "replace_original": False, "text": clicks.outcome.message}


def test_a_response_url_off_slack_is_not_posted_to(endpoint: tuple[SlackActions, Clicks, Posts]) -> None:
    actions, clicks, posts = endpoint
    raw = body(response_url="http://169.254.169.254/latest/meta-data")
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 200
    settle(actions)
    assert len(clicks.calls) == 1  # the click is Slack's (signed); only the echo is not sent there
    assert posts.sent == []


def test_an_oversized_body_is_refused_unread(endpoint: tuple[SlackActions, Clicks, Posts]) -> None:
    actions, clicks, _ = endpoint
    raw = b"payload=" + b"x" * 70_000
    assert actions(signed(raw), raw, "10.0.0.7")[0] == 413
    assert clicks.calls == []
