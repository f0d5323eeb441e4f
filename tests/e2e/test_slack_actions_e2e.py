"""Slack for each team and from each warning, on the real local cluster (issue 36, items 3 and 4).

Each team its own channel: a Slack app's webhook ignores ``channel``, so two namespaces name their
own webhook's key in the notify Secret (``slack-url-secret-key``) and their warnings must reach two
different receivers, none the sink's shared one.

Keep from Slack: with the Slack app configured, the warning carries Keep for / Release now buttons
whose values are the page link's signed token. A POST signed as Slack signs (``v0:ts:body``) to the
operator's /slack/actions keeps the pod (keep-for written, an event naming the Slack click) and
answers through the payload's response_url; a badly signed one changes nothing.

The receivers (webhooks and response_url) are one real HTTP server, one path each; the operator
reads the webhook URLs and its keys from files, as from the Secrets the chart mounts.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency.slackapp.signature import sign
from tests.e2e.harness import Cluster, create_namespace, delete_namespace, wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_notify_e2e import (
    Receiver,
    check_slack_blocks,
    events_of,
    free_port,
    pod_annotations,
    pod_name,
    receiver,  # noqa: F401
    warned_annotations,
)
from tests.e2e.test_operator import (  # noqa: F401
    condition,
    create_policy,
    deployment,
    policies,
    policy_body,
    policy_events,
    running_pod,
)

pytestmark = pytest.mark.e2e

#: Long enough that nothing is reclaimed while the test looks at the warnings.
WARNING_PERIOD_S = 120


def warnings_at(sink: Receiver, path: str) -> list[str]:
    """The headers of the Slack warnings posted to ``path``."""
    out = []
    for post in sink.at(path):
        check_slack_blocks(post.body)
        blocks = post.body["blocks"]
        context = blocks[-1]["elements"][0]["text"]
        if context.endswith(names.EV_EVICTION_SCHEDULED):
            out.append(blocks[0]["text"]["text"])
    return out


def test_each_namespace_s_warnings_reach_its_own_slack_webhook(
    cluster: Cluster,
    k8s: client.ApiClient,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],  # noqa: F811
    receiver: Receiver,  # noqa: F811
    tmp_path: Path,
) -> None:
    """team-a and team-b get their own webhooks; team-c's annotation is not a Secret key and
    team-d's key is not in the Secret: both fall back to the sink's webhook, and the policy says so."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    keys = {"a": "slack-team-a", "b": "slack-team-b", "c": "../slack-team-a", "d": "slack-team-d"}
    teams = {t: create_namespace(k8s, f"t-slack-{t}") for t in keys}
    try:
        secret_dir = tmp_path / "notify-secret"
        secret_dir.mkdir()
        for key in ("shared", "slack-team-a", "slack-team-b"):
            (secret_dir / key).write_text(f"{receiver.base_url}/{key}\n")
        for t, ns in teams.items():
            core.patch_namespace(ns, {"metadata": {"annotations": {names.SLACK_URL_SECRET_KEY: keys[t]}}})
            apps.create_namespaced_deployment(ns, deployment(ns, "nb", "idle", gpu_nodes))
        selector = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(teams.values())}
        policy = create_policy(
            k8s,
            policies,
            policy_body(
                f"slack-routes-{uuid.uuid4().hex[:6]}",
                teams["a"],
                mode="Enforce",
                selection={"namespaceSelector": {"matchExpressions": [selector]}},
                idle={"idleFor": "6s", "warningPeriod": f"{WARNING_PERIOD_S}s"},
                reclaim={"actions": {"Deployment": "ScaleToZero"}},
                notify=[{"name": "chat", "type": "Slack", "urlSecretKey": "shared"}],
            ),
        )
        operator = start_operator("--notify-secret-dir", str(secret_dir))
        pods = {
            t: pod_name(wait_for(lambda ns=ns: running_pod(core, ns, "nb"), 60, what=f"{ns}/nb"))
            for t, ns in teams.items()
        }
        for t, pod in pods.items():
            ns = teams[t]
            wait_for(lambda ns=ns, pod=pod: warned_annotations(core, ns, pod), 90, what=f"{ns}/{pod} warned")

        def headline(t: str) -> str:
            return f"GPU about to be reclaimed: {teams[t]}/{pods[t]}"

        a = wait_for(
            lambda: warnings_at(receiver, "/slack-team-a"), 30, what="team-a's warning at its webhook"
        )
        b = wait_for(
            lambda: warnings_at(receiver, "/slack-team-b"), 30, what="team-b's warning at its webhook"
        )
        shared = wait_for(
            lambda: (found := warnings_at(receiver, "/shared")) and len(found) >= 2 and found,
            30,
            what="team-c's and team-d's warnings at the sink's webhook",
        )
        assert a == [headline("a")], a
        assert b == [headline("b")], b
        assert sorted(shared) == sorted([headline("c"), headline("d")]), shared

        # Both fallbacks are named on the policy (never a URL), with one NotificationFailed event.
        cond = wait_for(
            lambda: (
                (c := condition(k8s, policy, names.COND_NOTIFY))
                and teams["d"] in c["message"]
                and teams["c"] in c["message"]
                and c
            ),
            30,
            what="NotificationsHealthy naming team-c and team-d",
        )
        assert (cond["status"], cond["reason"]) == ("False", "SlackRouteInvalid"), cond
        assert "'../slack-team-a' is ignored" in cond["message"], cond
        assert "slack-team-d" in cond["message"], cond
        assert receiver.base_url not in cond["message"], cond
        assert policy_events(k8s, policy, names.EV_NOTIFICATION_FAILED) == 1
        assert operator.alive()
    finally:
        for ns in teams.values():
            delete_namespace(k8s, ns)


# ---- keep from Slack -----------------------------------------------------------------------------

SIGNING_SECRET = b"e2e-slack-signing-secret-0123456789abcdef"


def check_slack_blocks_with_buttons(body: dict[str, Any]) -> dict[str, Any]:
    """The warning's Block Kit with its actions block (checked apart: check_slack_blocks knows none)."""
    actions = [b for b in body["blocks"] if b.get("type") == "actions"]
    assert len(actions) == 1, body
    check_slack_blocks({**body, "blocks": [b for b in body["blocks"] if b.get("type") != "actions"]})
    elements = actions[0]["elements"]
    assert 0 < len(elements) <= 25, actions
    for e in elements:
        assert e["type"] == "button", e
        assert e["text"]["type"] == "plain_text", e
        assert 0 < len(e["value"]) <= 2000, e
        assert 0 < len(e["action_id"]) <= 255, e
    return actions[0]


def post_click(port: int, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/slack/actions",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def slack_signed(body: bytes, secret: bytes = SIGNING_SECRET) -> dict[str, str]:
    ts = str(int(time.time()))
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sign(secret, ts, body)}


def test_a_click_signed_as_slack_signs_keeps_the_pod_and_a_forged_one_changes_nothing(
    cluster: Cluster,
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],  # noqa: F811
    receiver: Receiver,  # noqa: F811
    tmp_path: Path,
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    secret_dir = tmp_path / "notify-secret"
    secret_dir.mkdir()
    (secret_dir / "shared").write_text(f"{receiver.base_url}/shared\n")
    (tmp_path / "selfservice-key").write_bytes(b"k" * 48)
    (tmp_path / "signing-secret").write_bytes(SIGNING_SECRET + b"\n")
    apps.create_namespaced_deployment(namespace, deployment(namespace, "nb", "idle", gpu_nodes))
    create_policy(
        k8s,
        policies,
        policy_body(
            f"slack-keep-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "6s", "warningPeriod": f"{WARNING_PERIOD_S}s"},
            reclaim={"actions": {"Deployment": "ScaleToZero"}},
            notify=[{"name": "chat", "type": "Slack", "urlSecretKey": "shared"}],
        ),
    )
    port = free_port()
    operator = start_operator(
        "--notify-secret-dir", str(secret_dir),
        "--selfservice-port", str(port),
        "--selfservice-url", f"http://127.0.0.1:{port}",
        "--selfservice-key-file", str(tmp_path / "selfservice-key"),
        "--slack-signing-secret-file", str(tmp_path / "signing-secret"),
        "--slack-response-urls", f"{receiver.base_url}/",
    )  # fmt: skip
    pod = pod_name(wait_for(lambda: running_pod(core, namespace, "nb"), 60, what="nb running"))
    warned = wait_for(lambda: warned_annotations(core, namespace, pod), 90, what="nb warned")

    # ---- the warning's buttons carry the page link's token ----------------------------------------
    post = wait_for(lambda: receiver.at("/shared"), 30, what="the Slack warning").pop()
    block = check_slack_blocks_with_buttons(post.body)
    by_action = {e["action_id"]: e for e in block["elements"]}
    assert list(by_action) == [
        "gpuefficiency.keep.1h", "gpuefficiency.keep.2h", "gpuefficiency.keep.4h",
        "gpuefficiency.keep.8h", "gpuefficiency.keep.24h", "gpuefficiency.release",
    ], list(by_action)  # fmt: skip
    token = by_action["gpuefficiency.keep.2h"]["value"]
    assert {e["value"] for e in block["elements"]} == {token}
    assert warned[names.SELF_SERVICE].endswith("?t=" + token), warned[names.SELF_SERVICE]

    def payload(action_id: str) -> bytes:
        return urlencode({"payload": json.dumps({
            "type": "block_actions",
            "user": {"id": "U0E2E0001", "username": "researcher"},
            "response_url": f"{receiver.base_url}/response",
            "message": post.body,
            "actions": [{"action_id": action_id, "block_id": block["block_id"], "value": token}],
        })}).encode()  # fmt: skip

    # ---- a badly signed click changes nothing -----------------------------------------------------
    release = payload("gpuefficiency.release")
    assert post_click(port, release, slack_signed(release, b"not-the-signing-secret")) == 401
    stale = slack_signed(release)
    stale["X-Slack-Request-Timestamp"] = str(int(time.time()) - 600)
    stale["X-Slack-Signature"] = sign(SIGNING_SECRET, stale["X-Slack-Request-Timestamp"], release)
    assert post_click(port, release, stale) == 401
    keep = payload("gpuefficiency.keep.2h")
    assert post_click(port, keep + b"&x=1", slack_signed(keep)) == 401  # signed, then tampered
    untouched = pod_annotations(core, namespace, pod)
    assert names.KEEP_FOR not in untouched, untouched
    assert names.RELEASE not in untouched, untouched
    assert untouched[names.EVICT_AFTER] == warned[names.EVICT_AFTER], untouched
    assert not events_of(core, namespace, pod, names.EV_KEEP_CLICKED)
    assert not events_of(core, namespace, pod, names.EV_RELEASE_CLICKED)
    assert receiver.at("/response") == []

    # ---- a click signed as Slack signs keeps the pod, once -----------------------------------------
    assert post_click(port, keep, slack_signed(keep)) == 200
    kept = pod_annotations(core, namespace, pod)
    assert kept.get(names.KEEP_FOR) == "2h", kept
    assert names.RELEASE not in kept, kept
    (event,) = wait_for(
        lambda: events_of(core, namespace, pod, names.EV_KEEP_CLICKED), 20, what="the click's event"
    )
    assert "Slack user U0E2E0001" in str(event.message), event.message
    assert f"{names.KEEP_FOR}=2h" in str(event.message), event.message
    answer = wait_for(lambda: receiver.at("/response"), 20, what="the message update").pop()
    assert answer.body["replace_original"] is True, answer.body
    assert not [b for b in answer.body["blocks"] if b.get("type") == "actions"], answer.body
    outcome = answer.body["blocks"][-1]["elements"][0]["text"]
    assert outcome.startswith(":white_check_mark: GPU kept for 2h"), outcome
    assert outcome.endswith("(clicked by <@U0E2E0001>)"), outcome

    # A replay of the same click is answered and writes nothing more (one event).
    assert post_click(port, keep, slack_signed(keep)) == 200
    wait_for(lambda: len(receiver.at("/response")) == 2, 20, what="the replay's answer")
    assert len(events_of(core, namespace, pod, names.EV_KEEP_CLICKED)) == 1
    assert not events_of(core, namespace, pod, names.EV_RELEASE_CLICKED)
    assert operator.alive()
