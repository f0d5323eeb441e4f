"""Slack's request signature, checked exactly as Slack documents it
(https://api.slack.com/authentication/verifying-requests-from-slack).

Slack signs each request it sends to an app: ``v0=`` + hex HMAC-SHA256, keyed with the app's signing
secret, of ``v0:<X-Slack-Request-Timestamp>:<raw body>``, in ``X-Slack-Signature``. A request whose
timestamp is more than five minutes from our clock, either way, is refused (a replay), and the
signatures are compared in constant time. The body must be the raw bytes as received: parse it only
after it verified.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

VERSION = "v0"
SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP_HEADER = "x-slack-request-timestamp"
#: Slack's own bound: "If the request timestamp is more than five minutes from local time, it
#: could be a replay attack, so let's ignore it."
MAX_AGE_S = 5 * 60
#: Interaction payloads are a few KiB (the message's blocks included); Slack's own messages stop
#: at 50 blocks of at most 3000 characters, so 64 KiB leaves room and bounds what is hashed.
MAX_BODY_BYTES = 64 * 1024


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` value Slack would send (tests and the e2e sign with it)."""
    base = f"{VERSION}:{timestamp}:".encode() + body
    return f"{VERSION}=" + hmac.new(secret, base, hashlib.sha256).hexdigest()


def signature_problem(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> str:
    """Why the request is not from Slack ('' when its signature holds). ``headers`` with lower-case
    names. The answer names what is wrong, never the expected signature."""
    if not secret:
        return "no signing secret is configured"
    if len(body) > MAX_BODY_BYTES:
        return f"the body is over {MAX_BODY_BYTES} bytes"
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    signature = headers.get(SIGNATURE_HEADER, "")
    if not timestamp or not signature:
        return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        return f"{TIMESTAMP_HEADER} is not a unix time in seconds"
    if abs(now - int(timestamp)) > MAX_AGE_S:
        return f"{TIMESTAMP_HEADER} is more than {MAX_AGE_S // 60} minutes from now (a replay?)"
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        return "the signature does not match"
    return ""
