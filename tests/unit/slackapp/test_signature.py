"""Slack's request signature (slackapp/signature.py), checked against Slack's own worked example
(api.slack.com/authentication/verifying-requests-from-slack) and every way a request can be wrong."""

from __future__ import annotations

import pytest

from gpu_efficiency.slackapp.signature import MAX_AGE_S, MAX_BODY_BYTES, sign, signature_problem

# Slack's documented example: secret, timestamp, raw body and the signature Slack sent.
DOC_SECRET = b"8f742231b10e8888abcd99yyyzzz85a5"
DOC_TS = "1531420618"
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
    b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
    b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIG = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
NOW = float(DOC_TS) + 30


def headers(ts: str = DOC_TS, sig: str = DOC_SIG) -> dict[str, str]:
    return {"x-slack-request-timestamp": ts, "x-slack-signature": sig}


def test_slack_s_worked_example_signs_and_verifies() -> None:
    assert sign(DOC_SECRET, DOC_TS, DOC_BODY) == DOC_SIG
    assert signature_problem(DOC_SECRET, headers(), DOC_BODY, NOW) == ""


def test_a_tampered_body_is_refused() -> None:
    tampered = DOC_BODY.replace(b"roadrunner", b"roadrunnex")
    assert signature_problem(DOC_SECRET, headers(), tampered, NOW) == "the signature does not match"
    assert signature_problem(DOC_SECRET, headers(), DOC_BODY + b"&x=1", NOW) == "the signature does not match"


def test_a_wrong_secret_is_refused() -> None:
    assert signature_problem(b"another-secret", headers(), DOC_BODY, NOW) == "the signature does not match"
    assert "no signing secret" in signature_problem(b"", headers(), DOC_BODY, NOW)


def test_the_timestamp_is_signed_too() -> None:
    later = str(int(DOC_TS) + 1)
    assert signature_problem(DOC_SECRET, headers(ts=later), DOC_BODY, NOW) == "the signature does not match"


@pytest.mark.parametrize("offset", [MAX_AGE_S + 1, -(MAX_AGE_S + 1), 86400, -86400])
def test_a_timestamp_more_than_five_minutes_away_is_refused_even_if_signed(offset: int) -> None:
    """Old (a replay) or in the future: refused even when the signature over it is right."""
    ts = str(int(NOW) - offset)
    problem = signature_problem(DOC_SECRET, headers(ts, sign(DOC_SECRET, ts, DOC_BODY)), DOC_BODY, NOW)
    assert "more than 5 minutes from now" in problem


@pytest.mark.parametrize("offset", [MAX_AGE_S, -MAX_AGE_S, 0])
def test_a_timestamp_within_five_minutes_is_accepted(offset: int) -> None:
    ts = str(int(NOW) - offset)
    assert signature_problem(DOC_SECRET, headers(ts, sign(DOC_SECRET, ts, DOC_BODY)), DOC_BODY, NOW) == ""


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"x-slack-signature": DOC_SIG},
        {"x-slack-request-timestamp": DOC_TS},
        headers(sig=""),
        headers(ts=""),
    ],
)
def test_missing_headers_are_refused(given: dict[str, str]) -> None:
    assert signature_problem(DOC_SECRET, given, DOC_BODY, NOW).startswith("missing ")


@pytest.mark.parametrize("ts", ["1531420618.5", "-1531420618", "abc", "1e9", "١٥٣١٤٢٠٦١٨", "9" * 40])
def test_a_timestamp_that_is_not_unix_seconds_is_refused(ts: str) -> None:
    assert "not a unix time" in signature_problem(DOC_SECRET, headers(ts=ts), DOC_BODY, NOW)


@pytest.mark.parametrize("sig", ["v1=" + DOC_SIG[3:], DOC_SIG[3:], DOC_SIG.upper(), DOC_SIG[:-1], "v0=é"])
def test_a_malformed_signature_is_refused(sig: str) -> None:
    assert signature_problem(DOC_SECRET, headers(sig=sig), DOC_BODY, NOW) == "the signature does not match"


def test_an_oversized_body_is_refused_before_it_is_hashed() -> None:
    body = b"x" * (MAX_BODY_BYTES + 1)
    signed = headers(sig=sign(DOC_SECRET, DOC_TS, body))
    assert "over" in signature_problem(DOC_SECRET, signed, body, NOW)
