"""The --slack-response-urls setting (slackapp/service.py): only URL prefixes ending in '/' are
accepted, so a prefix can never be extended into another host (hooks.slack.com.evil.example)."""

from __future__ import annotations

import pytest

from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.slackapp.service import response_prefixes


def test_the_default_is_slack_s_and_govslack_s_hosts() -> None:
    assert response_prefixes(OperatorConfig(identity="x").slack_response_urls) == (
        "https://hooks.slack.com/",
        "https://hooks.slack-gov.com/",
    )


def test_spaces_and_empty_items_are_ignored() -> None:
    assert response_prefixes(" http://127.0.0.1:8080/ ,, ") == ("http://127.0.0.1:8080/",)


@pytest.mark.parametrize(
    "value",
    ["https://hooks.slack.com", "hooks.slack.com/", "ftp://hooks.slack.com/", "https:///", "https://"],
)
def test_a_prefix_that_could_match_another_host_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a URL prefix ending in '/'"):
        response_prefixes(value)
