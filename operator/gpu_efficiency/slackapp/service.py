"""Start-up of the Slack app's endpoint: ``/slack/actions`` on the self-service server, sharing its
token key and its click writer with the page, so a Slack click is held to exactly what a click on
the page is (this pod, this policy, the policy's maxKeep, leader only, one event, one count)."""

from __future__ import annotations

from urllib.parse import urlsplit

from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.selfservice.service import SelfService
from gpu_efficiency.slackapp.interactions import PATH, SlackActions


def response_prefixes(setting: str) -> tuple[str, ...]:
    """The ``--slack-response-urls`` prefixes; each must be an https (or, for tests, http) URL
    prefix ending in '/', so ``https://hooks.slack.com.evil`` never matches ``https://hooks.slack.com``."""
    out = []
    for raw in setting.split(","):
        prefix = raw.strip()
        if not prefix:
            continue
        parts = urlsplit(prefix)
        if parts.scheme not in ("https", "http") or not parts.netloc or not parts.path.endswith("/"):
            raise ValueError(f"--slack-response-urls: {prefix!r} is not a URL prefix ending in '/'")
        out.append(prefix)
    return tuple(out)


def start_slack_actions(config: OperatorConfig, selfservice: SelfService) -> SlackActions:
    """Register the endpoint (config.slack_signing_secret_file must be set)."""
    key = selfservice.key
    actions = SlackActions(
        signing_secret_file=config.slack_signing_secret_file,
        token_key=lambda: key,
        apply_click=selfservice.clicker.apply,
        response_prefixes=response_prefixes(config.slack_response_urls),
    )
    selfservice.server.register_post(PATH, actions)
    return actions
