"""Signed self-service links: an HMAC-SHA256 token bound to one pod (its uid), one policy and an
expiry at the reclaim deadline. Pure (no I/O): the key is bytes read by the caller.

A token is ``<payload>.<mac>``, both base64url without padding; the payload is compact JSON
``{"n": namespace, "p": pod, "u": uid, "y": policy, "e": expiry}``. The uid makes a link useless for
a pod recreated under the same name; the expiry makes it useless after the deadline it announced.
``verify`` compares MACs in constant time (``hmac.compare_digest``) and says why a token is refused,
so the page can say it in plain words without ever acting on a refused token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from urllib.parse import quote

#: Keys shorter than this are refused: RFC 2104 §3 asks for at least the hash's output length.
MIN_KEY_BYTES = 32
#: Longest token accepted (a payload of Kubernetes names fits in far less): bounds the work of a forgery.
MAX_TOKEN_CHARS = 2048
#: The page's path; the token follows as ``?t=``.
PAGE_PATH = "/gpu"


class TokenError(ValueError):
    """A token that must not be acted on; the message says why, in plain words."""


@dataclass(frozen=True, slots=True)
class Claims:
    """What a token grants: the right to see and answer the warning of this pod until ``expires``."""

    namespace: str
    pod: str
    uid: str
    policy: str
    expires: int  # unix seconds: the reclaim deadline the warning announced


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, b"gpu-efficiency/selfservice/v1|" + payload.encode(), hashlib.sha256).digest()


def check_key(key: bytes) -> bytes:
    """The key, stripped of the newline a Secret file often ends with; ValueError when too short."""
    key = key.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the self-service key has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key


def sign(key: bytes, claims: Claims) -> str:
    """The token of ``claims`` under ``key``."""
    body = {"n": claims.namespace, "p": claims.pod, "u": claims.uid, "y": claims.policy, "e": claims.expires}
    payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{payload}.{_b64(_mac(key, payload))}"


def verify(key: bytes, token: str, now: float) -> Claims:
    """The claims of a token made with ``key`` and not yet expired; TokenError otherwise."""
    if not token:
        raise TokenError("this link carries no token")
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise TokenError("this link is malformed")
    payload, mac = token.split(".")
    try:
        given = _unb64(mac)
    except (binascii.Error, ValueError):
        raise TokenError("this link is malformed") from None
    if not hmac.compare_digest(given, _mac(key, payload)):
        raise TokenError("this link's signature is wrong (it was altered, or made with another key)")
    try:
        body = json.loads(_unb64(payload))
        claims = Claims(
            namespace=str(body["n"]),
            pod=str(body["p"]),
            uid=str(body["u"]),
            policy=str(body["y"]),
            expires=int(body["e"]),
        )
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise TokenError("this link is malformed") from None
    if now >= claims.expires:
        raise TokenError("this link has expired: the deadline it announced has passed")
    return claims


def link(base_url: str, token: str) -> str:
    """The page's address for ``token`` under the operator's public base URL."""
    return f"{base_url.rstrip('/')}{PAGE_PATH}?t={quote(token, safe='')}"
