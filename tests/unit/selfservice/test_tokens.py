"""Link tokens: a tampered, expired, foreign-key or other pod's token is refused; a good one reads back."""

from __future__ import annotations

import pytest

from gpu_efficiency.selfservice.tokens import MIN_KEY_BYTES, Claims, TokenError, check_key, link, sign, verify

KEY = b"k" * 32
NOW = 1_800_000_000.0
CLAIMS = Claims(namespace="team-a", pod="nb-0", uid="uid-1", policy="default", expires=int(NOW) + 600)


def test_a_token_reads_back_its_claims_until_it_expires() -> None:
    token = sign(KEY, CLAIMS)
    assert verify(KEY, token, NOW) == CLAIMS
    assert verify(KEY, token, NOW + 599) == CLAIMS
    with pytest.raises(TokenError, match="expired"):
        verify(KEY, token, NOW + 600)


@pytest.mark.parametrize("position", [0, 5, 20, -1, -5])
def test_any_altered_character_is_refused(position: int) -> None:
    token = sign(KEY, CLAIMS)
    chars = list(token)
    if chars[position] == ".":
        position += 1
    chars[position] = "A" if chars[position] != "A" else "B"
    with pytest.raises(TokenError):
        verify(KEY, "".join(chars), NOW)


def test_a_token_for_another_pod_cannot_be_grafted_onto_this_signature() -> None:
    mine = sign(KEY, CLAIMS)
    other = sign(KEY, Claims("team-b", "train-0", "uid-2", "default", CLAIMS.expires))
    forged = other.split(".")[0] + "." + mine.split(".")[1]
    with pytest.raises(TokenError, match="signature"):
        verify(KEY, forged, NOW)


def test_a_longer_expiry_cannot_be_written_into_a_token() -> None:
    import base64
    import json

    payload, mac = sign(KEY, CLAIMS).split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["e"] += 86400
    longer = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="signature"):
        verify(KEY, f"{longer}.{mac}", NOW)


def test_another_key_refuses_the_token() -> None:
    with pytest.raises(TokenError, match="signature"):
        verify(b"x" * 32, sign(KEY, CLAIMS), NOW)


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "." * 3, "x" * 5000, "e30.!!!"])
def test_malformed_tokens_are_refused_with_a_reason(token: str) -> None:
    with pytest.raises(TokenError):
        verify(KEY, token, NOW)


def test_a_short_key_is_refused_and_a_trailing_newline_ignored() -> None:
    with pytest.raises(ValueError, match=str(MIN_KEY_BYTES)):
        check_key(b"short\n")
    assert check_key(KEY + b"\n") == KEY


def test_the_link_quotes_the_token_under_the_base_url() -> None:
    token = sign(KEY, CLAIMS)
    assert link("https://gpu.example.com/", token) == f"https://gpu.example.com/gpu?t={token}"
