"""Per-namespace Slack webhooks (engine/notify/routes.py): a Slack app's webhook ignores
``channel``, so a namespace is routed by naming its own webhook's key in the notify Secret. Values
that cannot be a Secret key (a path, the kubelet's ``..data``) are reported and never followed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine.notify.test_messages import until_warning

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import NotifySink
from gpu_efficiency.engine.model import NamespaceView
from gpu_efficiency.engine.notify.messages import notifications, notifications_condition
from gpu_efficiency.engine.notify.routes import route_problems, secret_key_problem, slack_routes


def ns(name: str, key: str | None) -> NamespaceView:
    return NamespaceView(name, {}, {names.SLACK_URL_SECRET_KEY: key} if key is not None else {})


def slack(**fields: object) -> NotifySink:
    return NotifySink.model_validate({"name": "s", "type": "Slack", "urlSecretKey": "shared", **fields})


@pytest.mark.parametrize("value", ["slack-team-a", "team_a.url", "A1", "x" * 253, ".hidden"])
def test_a_secret_key_is_accepted(value: str) -> None:
    assert secret_key_problem(value) == ""


@pytest.mark.parametrize(
    "value",
    ["", "../token", "a/b", "/etc/passwd", "..data", "..", ".", "team a", "x" * 254, "ключ", "a\nb"],
)
def test_what_cannot_be_a_secret_key_is_refused(value: str) -> None:
    assert secret_key_problem(value) != ""


def test_each_namespace_gets_its_key_and_a_bad_value_is_reported_not_followed() -> None:
    routes = slack_routes(
        [ns("team-a", " slack-a "), ns("team-b", "slack-b"), ns("team-c", "../x"), ns("d", None)]
    )
    assert routes.keys == {"team-a": "slack-a", "team-b": "slack-b"}
    assert list(routes.invalid) == ["team-c"]
    assert "'../x' is ignored" in routes.invalid["team-c"]
    assert "sink's own webhook" in routes.invalid["team-c"]


def test_a_long_bad_value_is_shortened_in_the_report() -> None:
    routes = slack_routes([ns("t", "/" * 500)])
    assert len(routes.invalid["t"]) < 250


def test_problems_are_reported_only_for_judged_namespaces_a_slack_sink_serves() -> None:
    routes = slack_routes([ns("a", "../x"), ns("b", "a/b"), ns("c", "..data")])
    assert list(route_problems(routes, [slack()], ["a", "c", "a"])) == ["a", "c"]
    assert list(route_problems(routes, [slack(namespaces=["c"])], ["a", "c"])) == ["c"]
    ce = NotifySink.model_validate({"name": "ce", "type": "CloudEvents", "urlSecretKey": "ce"})
    assert route_problems(routes, [ce], ["a", "b", "c"]) == {}


def test_a_warning_carries_its_namespace_s_webhook_key() -> None:
    snap, plan = until_warning()
    for key, expected in (("slack-team-a", "slack-team-a"), ("../x", "")):
        routed = replace(snap, namespaces=(ns("team-a", key),))
        found = notifications(
            plan.actions, (), routed, plan, window_s=600, max_keep_s=86400, keep_allowed=True
        )
        (n,) = [n for n in found if n.reason == names.EV_EVICTION_SCHEDULED]
        assert n.slack_url_key == expected


def test_a_bad_annotation_turns_the_condition_false_with_one_event() -> None:
    bad = {"team-c": "gpuefficiency.io/slack-url-secret-key='../x' is ignored (...)"}
    conditions, event = notifications_condition([], {}, sinks=1, now=1000.0, generation=1, misrouted=bad)
    (cond,) = conditions
    assert (cond.status, cond.reason) == ("False", "SlackRouteInvalid")
    assert "namespace team-c: " in cond.message
    assert event is not None
    assert event.reason == names.EV_NOTIFICATION_FAILED
    assert "not routed as asked" in event.message
    again, event = notifications_condition(conditions, {}, sinks=1, now=1060.0, generation=1, misrouted=bad)
    assert event is None
    assert again == conditions
    healthy, _ = notifications_condition(conditions, {}, sinks=1, now=1120.0, generation=1, misrouted={})
    assert healthy[0].status == "True"


def test_a_delivery_failure_and_a_bad_annotation_are_both_named() -> None:
    conditions, _ = notifications_condition(
        [], {"s": "HTTP 404"}, sinks=1, now=1000.0, generation=1, misrouted={"t": "bad"}
    )
    assert conditions[0].reason == "DeliveryFailed"
    assert conditions[0].message == "sink s: HTTP 404; namespace t: bad"
