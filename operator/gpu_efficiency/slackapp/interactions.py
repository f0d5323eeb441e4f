"""The Slack app's interaction endpoint: a click on a warning's Keep for / Release now button.

Slack POSTs ``application/x-www-form-urlencoded`` with one field, ``payload`` (JSON), signed with
the app's signing secret. In order, and changing nothing until the last step:

1. the signature (signature.py: ``v0:timestamp:body``, five minutes, constant time) over the raw
   body, with the secret read from its mounted file at each request (a rotated Secret applies);
2. the payload: a ``block_actions`` with one of our buttons;
3. the button's value, the warning's signed token (selfservice/tokens.py: this pod, this policy,
   until the deadline);
4. the click, through the same module as the page's (selfservice/clicks.py: leader only, the
   policy's maxKeep re-checked, idempotent, an event on the pod naming the click and who made it);
5. the answer: the original message replaced through the payload's ``response_url`` (only to Slack's
   own hosts), by a worker thread so Slack gets its 200 within its three seconds.

A refused request gets a plain 4xx and nothing else; its reason is logged, never echoed with a secret.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from gpu_efficiency.selfservice.clicks import Click, ClickOutcome, Keep, Release
from gpu_efficiency.selfservice.server import TEXT, Reply
from gpu_efficiency.selfservice.tokens import Claims, TokenError, verify
from gpu_efficiency.slackapp.buttons import answered, parse_action, who
from gpu_efficiency.slackapp.signature import MAX_BODY_BYTES, signature_problem

log = logging.getLogger(__name__)

#: The route the chart's Service exposes and the Slack app's "Interactivity Request URL" names.
PATH = "/slack/actions"
#: Where a ``response_url`` may point: Slack's own webhook host. Anything else in a (signed) payload
#: is not posted to, so a leaked signing secret cannot turn the operator into a request forwarder.
SLACK_RESPONSE_PREFIXES = ("https://hooks.slack.com/",)
RESPONSE_TIMEOUT_S = 5.0

#: (claims, click, remote, via) -> outcome: selfservice.clicks.Clicker.apply.
ApplyClick = Callable[..., ClickOutcome]
#: (url, JSON body, timeout) -> HTTP status.
PostJson = Callable[[str, bytes, float], int]


def post_json(url: str, body: bytes, timeout: float) -> int:
    response = httpx.post(
        url,
        content=body,
        headers={"Content-Type": "application/json", "User-Agent": "gpu-efficiency-operator"},
        timeout=timeout,
        follow_redirects=False,
    )
    return response.status_code


def _plain(status: int, text: str) -> Reply:
    return status, TEXT, (text + "\n").encode()


class SlackActions:
    """The POST handler of ``PATH`` (selfservice.server's ``register_post`` signature)."""

    def __init__(
        self,
        *,
        signing_secret_file: str | Path,
        token_key: Callable[[], bytes],
        apply_click: ApplyClick,
        response_prefixes: tuple[str, ...] = SLACK_RESPONSE_PREFIXES,
        post: PostJson = post_json,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.secret_file = Path(signing_secret_file)
        self.token_key = token_key
        self.apply_click = apply_click
        self.response_prefixes = response_prefixes
        self.post = post
        self.clock = clock
        self._responder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="slack-response")
        self.last_response: Future[None] | None = None  # tests wait on it

    def _secret(self) -> bytes:
        try:
            return self.secret_file.read_bytes().strip()
        except OSError as exc:
            log.warning(
                "Slack actions: cannot read the signing secret %s (%s)", self.secret_file, exc.strerror
            )
            return b""

    def __call__(self, headers: Mapping[str, str], body: bytes, remote: str) -> Reply:
        if len(body) > MAX_BODY_BYTES:
            return _plain(413, "request too large")
        secret = self._secret()
        if not secret:
            return _plain(503, "Slack actions are not configured (no signing secret)")
        problem = signature_problem(secret, headers, body, self.clock())
        if problem:
            log.warning("Slack actions: request from %s refused: %s", remote, problem)
            return _plain(401, f"not signed by Slack: {problem}")
        payload = _payload(body)
        if payload is None:
            return _plain(400, "not a Slack block_actions payload")
        parsed = _button(payload)
        if parsed is None:
            return _plain(400, "not one of the operator's buttons")
        (kind, duration), token, response_url = parsed
        user = payload.get("user") if isinstance(payload.get("user"), Mapping) else {}
        clicked_by = who(user or {})
        try:
            claims = verify(self.token_key(), token, self.clock())
        except (TokenError, ValueError) as exc:
            outcome = ClickOutcome(403, False, f"this button no longer works: {exc}")
            self._respond(response_url, payload, outcome, clicked_by)
            return _plain(200, "")
        click: Click = Keep(duration) if kind == "keep" else Release()
        outcome = self.apply_click(claims, click, remote=_remote(user or {}, remote), via="slack")
        self._respond(response_url, payload, outcome, clicked_by, claims)
        return _plain(200, "")

    def _respond(
        self,
        url: str,
        payload: Mapping[str, Any],
        outcome: ClickOutcome,
        clicked_by: str,
        claims: Claims | None = None,
    ) -> None:
        """Replace the original message (a 503 'try again' keeps the buttons: nothing happened)."""
        if not url.startswith(self.response_prefixes):
            log.warning("Slack actions: response_url to %s not posted to", urlsplit(url).netloc or "nowhere")
            return
        if outcome.status == 503:
            body = {"response_type": "ephemeral", "replace_original": False, "text": outcome.message}
        else:
            original = payload.get("message") if isinstance(payload.get("message"), Mapping) else {}
            body = answered(original or {}, outcome.message, outcome.status == 200, clicked_by)
        data = json.dumps(body).encode()
        where = f"{claims.namespace}/{claims.pod}" if claims else "a refused click"
        self.last_response = self._responder.submit(self._post, url, data, where)

    def _post(self, url: str, data: bytes, where: str) -> None:
        try:
            status = self.post(url, data, RESPONSE_TIMEOUT_S)
        except Exception as exc:  # the click is applied; only its echo in Slack is lost
            log.warning("Slack actions: the answer for %s was not posted: %s", where, type(exc).__name__)
            return
        if not 200 <= status < 300:
            log.warning("Slack actions: the answer for %s was refused: HTTP %s", where, status)

    def stop(self) -> None:
        self._responder.shutdown(wait=False, cancel_futures=True)


def _payload(body: bytes) -> dict[str, Any] | None:
    """The JSON of the form's ``payload`` field when it is a ``block_actions`` interaction."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=8)
        (raw,) = form.get("payload", [])
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    return payload


def _button(payload: Mapping[str, Any]) -> tuple[tuple[str, str], str, str] | None:
    """((kind, duration), token, response_url) of the one action clicked."""
    actions = payload.get("actions")
    if not isinstance(actions, list) or len(actions) != 1 or not isinstance(actions[0], Mapping):
        return None
    parsed = parse_action(str(actions[0].get("action_id") or ""))
    token = actions[0].get("value")
    url = payload.get("response_url")
    if parsed is None or not isinstance(token, str) or not isinstance(url, str):
        return None
    return parsed, token, url


def _remote(user: Mapping[str, Any], peer: str) -> str:
    """Who clicked, for the pod's event: the Slack user (id and name as Slack sent them, signed)."""
    uid = str(user.get("id") or "?")[:32]
    name = str(user.get("username") or user.get("name") or "")[:64]
    return f"Slack user {uid}{f' ({name})' if name else ''} via {peer}"
