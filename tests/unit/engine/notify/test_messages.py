"""Notification payloads (engine/notify/messages.py): CloudEvents 1.0 structured JSON with the fields a
receiver acts on, and Slack Block Kit messages written for the person who owns the pod."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401

from gpu_efficiency.actuators.notify.wire import cloudevent, slack_message
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import NotifySink
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    EvictPod,
    NamespaceView,
    NodeEvent,
    OwnerEvent,
    OwnerRef,
    Plan,
    PodEvent,
    Snapshot,
)
from gpu_efficiency.engine.notify.messages import Notification, notifications
from gpu_efficiency.engine.planner import plan_cycle

pytestmark = pytest.mark.usefixtures("no_faults")

KEEP = "kubectl annotate pod p -n team-a gpuefficiency.io/keep-for=4h --overwrite"


def until_warning(channel: str = "") -> tuple[Snapshot, Plan]:
    """Cycles a minute apart until the plan that warns the idle pod."""
    namespaces = [NamespaceView("team-a", {}, {names.NOTIFY_CHANNEL: channel} if channel else {})]
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [pod("p")], enforce(), namespaces=namespaces)
    for _ in range(10):
        plan = plan_cycle(snap)
        if any(isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_SCHEDULED for a in plan.actions):
            return snap, plan
        snap = apply_plan(snap, plan)
    raise AssertionError("never warned")


def warning(channel: str = "") -> Notification:
    snap, plan = until_warning(channel)
    found = notifications(plan.actions, (), snap, plan, window_s=600, max_keep_s=86400, keep_allowed=True)
    (n,) = [n for n in found if n.reason == names.EV_EVICTION_SCHEDULED]
    return n


def test_the_warning_carries_pod_node_gpu_verdict_deadline_and_the_command() -> None:
    n = warning()
    event = cloudevent(n)
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.gpuefficiency.GPUIdleEvictionScheduled"
    assert event["source"] == "/apis/gpuefficiency.io/v1alpha1/gpuefficiencypolicies/test-policy"
    assert event["subject"] == "namespaces/team-a/pods/p"
    assert event["datacontenttype"] == "application/json"
    assert event["time"] == format_rfc3339(n.time)
    assert len(event["id"]) == 32
    data = event["data"]
    assert data["namespace"] == "team-a"
    assert data["pod"] == "p"
    assert data["node"] == "node-0"
    assert data["gpus"] == ["GPU-0"]
    assert data["verdict"] == "Idle"
    assert data["diagnosis"] == "idle"
    assert data["deadline"] == format_rfc3339(n.time + 300)  # warningPeriod 5m
    assert data["acknowledge"] == KEEP
    assert data["message"].endswith(KEEP)
    assert data["why"].startswith("its GPU has done no work for ")


def test_the_id_is_the_same_for_the_same_warning_and_differs_for_another_deadline() -> None:
    n = warning()
    assert cloudevent(n)["id"] == cloudevent(replace(n, time=n.time + 60))["id"]
    assert cloudevent(n)["id"] != cloudevent(replace(n, deadline=(n.deadline or 0) + 60))["id"]


def test_slack_message_says_what_why_when_and_how_to_keep_it_in_block_kit() -> None:
    message = slack_message(warning())
    assert message["text"].endswith(f"To keep it: {KEEP}")
    assert "channel" not in message
    header, section, facts, context = message["blocks"]
    assert header["type"] == "header"
    assert header["text"]["type"] == "plain_text"
    assert header["text"]["text"] == "GPU about to be reclaimed: team-a/p"
    assert len(header["text"]["text"]) <= 150
    lines = section["text"]["text"].splitlines()
    assert section["text"]["type"] == "mrkdwn"
    assert lines[0].startswith("*What:* this GPU has done no work for ")
    assert "evidence" not in lines[0]  # numbers go below the plain words
    assert lines[1].startswith("*Why:* its GPU has done no work for ")
    assert lines[2].startswith("*When:* ")
    assert lines[2].endswith("(in 5m)")
    assert lines[3] == f"*Keep it:* run `{KEEP}`"
    assert facts["type"] == "section"
    assert {"type": "mrkdwn", "text": "*GPU*\nGPU-0"} in facts["fields"]
    assert len(facts["fields"]) <= 10
    assert context["type"] == "context"


def test_the_namespace_annotation_routes_slack_messages_to_its_channel() -> None:
    assert slack_message(warning("#team-a-gpus"))["channel"] == "#team-a-gpus"


def test_evictions_first_refusals_and_node_faults_become_notifications() -> None:
    snap, plan = until_warning()
    evict = EvictPod(namespace="team-a", name="p", uid="uid-team-a-p", reason="evicted to free the GPU")
    fault = NodeEvent(
        node="node-0", reason=names.EV_FAULT, message="GPU-0 has a double-bit ECC error: counter rose by 1"
    )
    done = notifications([evict, fault], (), snap, plan, window_s=600, max_keep_s=86400, keep_allowed=True)
    assert [(n.reason, n.kind, n.acknowledge) for n in done] == [
        (names.EV_EVICTED, "Pod", ""),
        (names.EV_FAULT, "Node", ""),
    ]
    assert cloudevent(done[1])["subject"] == "nodes/node-0"
    refused = notifications([], [evict], snap, plan, window_s=600, max_keep_s=86400, keep_allowed=True)
    assert [n.reason for n in refused] == [names.EV_EVICTION_BLOCKED]


def test_a_revert_on_the_owner_becomes_a_notification() -> None:
    snap, plan = until_warning()
    reverted = OwnerEvent(
        namespace="team-a",
        owner=OwnerRef("apps/v1", "Deployment", "web", "uid-web"),
        reason=names.EV_RECLAIM_REVERTED,
        message="deployment/web was reclaimed (ScaleToZero) and is back without gpu-efficiency restore",
    )
    (n,) = notifications([reverted], (), snap, plan, window_s=600, max_keep_s=86400, keep_allowed=True)
    assert (n.reason, n.kind, n.name, n.owner) == (
        names.EV_RECLAIM_REVERTED,
        "Deployment",
        "web",
        "deployment/web",
    )


def test_no_command_where_the_policy_honours_no_acknowledgement() -> None:
    snap, plan = until_warning()
    (n, *_) = notifications(plan.actions, (), snap, plan, window_s=600, max_keep_s=86400, keep_allowed=False)
    assert n.acknowledge == ""
    assert "Keep it" not in slack_message(n)["blocks"][1]["text"]["text"]


@pytest.mark.parametrize(
    ("reasons", "namespaces", "reason", "namespace", "wanted"),
    [
        ([], [], names.EV_EVICTION_SCHEDULED, "team-a", True),
        ([], [], names.EV_IDLE, "team-a", False),  # not in the default set
        (["GPUIdle"], [], names.EV_IDLE, "team-a", True),
        ([], ["team-b"], names.EV_EVICTION_SCHEDULED, "team-a", False),
        ([], ["team-a"], names.EV_EVICTION_SCHEDULED, "team-a", True),
        ([], ["team-a"], names.EV_FAULT, "", False),  # node events only to sinks for all namespaces
    ],
)
def test_a_sink_gets_only_its_reasons_and_namespaces(
    reasons: list[str], namespaces: list[str], reason: str, namespace: str, wanted: bool
) -> None:
    sink = NotifySink.model_validate(
        {"name": "s", "type": "Slack", "urlSecretKey": "k", "reasons": reasons, "namespaces": namespaces}
    )
    assert sink.wants(reason, namespace) is wanted


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_names_a_tenant_chose_reach_slack_as_text_never_as_mentions_or_links() -> None:
    """Issue 31.5: an owner name, pod name or message carrying Slack's control characters is sent
    with &, < and > escaped, in the message's text and in every block."""
    hostile = "<!channel> <https://evil.example/login|Click here> & co"
    n = replace(
        warning(), name=hostile, owner=f"deployment/{hostile}", pod=hostile,
        message=f"GPU idle: {hostile}", why=f"because {hostile}", restore=f"restore {hostile}",
    )  # fmt: skip
    message = slack_message(n)
    texts = [t for t in _strings({"text": message["text"], "blocks": message["blocks"]}) if t]
    assert not any("<" in t or ">" in t for t in texts)
    assert any("&lt;!channel&gt; &lt;https://evil.example/login|Click here&gt; &amp; co" in t for t in texts)
    assert message["text"].startswith("GPU about to be reclaimed: team-a/&lt;!channel&gt;")


def test_a_long_escaped_value_is_never_cut_inside_an_entity() -> None:
    n = replace(warning(), pod="&" * 3000)
    for field in slack_message(n)["blocks"][2]["fields"]:
        body = field["text"].rstrip("…")
        assert body.count("&") == body.count("&amp;")
