"""Notifications and the one-line acknowledgement on the real local cluster (issue 18).

A real HTTP receiver started by the test stands in for both webhooks (CloudEvents and Slack); the
operator reads their URLs from files, as from the Secret the chart mounts. Two idle Deployments are
warned; one is kept with ``gpu-efficiency keep``, the other is scaled to zero. The receiver must get
exactly one CloudEvent per warning and per action, in order, with the fields a person (or a routing
system) needs, and the operator's /metrics must show the pending eviction while it is pending.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.engine.timefmt import parse_rfc3339
from tests.e2e.harness import Cluster, wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_operator import (
    condition,
    create_policy,
    deployment,
    policies,  # noqa: F401
    policy_body,
    running_pod,
)
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

SCHEDULED = "io.gpuefficiency." + names.EV_EVICTION_SCHEDULED
RECLAIMED = "io.gpuefficiency." + names.EV_RECLAIMED
WARNING_PERIOD_S = 30  # room for the keep command (a Python start) well before the deadline


# ---- the webhook receiver ------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


@dataclass
class Receiver:
    """Records every POST (path, headers, JSON body) and answers 200."""

    server: ThreadingHTTPServer
    posts: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def cloudevents(self, type_: str | None = None, subject: str | None = None) -> list[Received]:
        return [
            p
            for p in self.at("/ce")
            if (type_ is None or p.body.get("type") == type_)
            and (subject is None or p.body.get("subject") == subject)
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or "0")
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"unparsable": raw.decode(errors="replace")}
            entry = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
            with holder[0].lock:
                holder[0].posts.append(entry)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


# ---- the operator's /metrics ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Samples = list[tuple[dict[str, str], float]]


def samples(port: int, name: str) -> Samples | None:
    """The operator's samples named ``name`` (None while /metrics does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def pending(port: int, policy: str, pod: str) -> Samples | None:
    """The pod's gpu_efficiency_pod_eviction_pending series (None while /metrics does not answer)."""
    found = samples(port, "gpu_efficiency_pod_eviction_pending")
    if found is None:
        return None
    return [
        (labels, value)
        for labels, value in found
        if labels.get("policy") == policy and labels.get("pod") == pod
    ]


def no_pending(port: int, policy: str, pod: str) -> bool:
    """/metrics answers and exports no pending eviction of the pod."""
    return pending(port, policy, pod) == []


def notification_counts(port: int, policy: str, result: str) -> dict[str, float]:
    """Sink -> gpu_efficiency_notifications_total of the policy for ``result``."""
    found = samples(port, "gpu_efficiency_notifications_total")
    assert found is not None, "the operator's /metrics does not answer"
    return {
        labels["sink"]: value
        for labels, value in found
        if labels.get("policy") == policy and labels.get("result") == result
    }


# ---- helpers -------------------------------------------------------------------------------------


def keep_line(namespace: str, pod: str) -> str:
    """The acknowledge command every warning ends with (4h: the default maxKeep of 24h is longer)."""
    return f"kubectl annotate pod {pod} -n {namespace} {names.KEEP_FOR}=4h --overwrite"


def pod_annotations(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    """The pod's annotations ({} once it is gone)."""
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict((pod.metadata and pod.metadata.annotations) or {})


def pod_name(pod: client.V1Pod) -> str:
    assert pod.metadata is not None
    return str(pod.metadata.name)


def warned_annotations(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str] | None:
    """The pod's annotations once it carries a warning (evict-after)."""
    found = pod_annotations(core, namespace, name)
    return found if names.EVICT_AFTER in found else None


def warning_events(core: client.CoreV1Api, namespace: str, pod: str) -> list[client.CoreV1Event]:
    return [
        e
        for e in core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items
        if e.reason == names.EV_EVICTION_SCHEDULED
    ]


def replicas(apps: client.AppsV1Api, namespace: str, name: str) -> int:
    return int(apps.read_namespaced_deployment(name, namespace).spec.replicas or 0)


def check_slack_blocks(body: dict[str, Any]) -> None:
    """Slack Block Kit's structure and limits (https://api.slack.com/reference/block-kit/blocks)."""
    assert isinstance(body.get("text"), str), body
    assert body["text"], body
    blocks = body.get("blocks")
    assert isinstance(blocks, list), body
    assert 0 < len(blocks) <= 50, body
    for block in blocks:
        kind = block.get("type")
        if kind == "header":
            assert block["text"]["type"] == "plain_text", block
            assert 0 < len(block["text"]["text"]) <= 150, block
        elif kind == "section":
            assert "text" in block or "fields" in block, block
            if "text" in block:
                assert block["text"]["type"] in ("mrkdwn", "plain_text"), block
                assert 0 < len(block["text"]["text"]) <= 3000, block
            for f in block.get("fields", []):
                assert f["type"] in ("mrkdwn", "plain_text"), f
                assert 0 < len(f["text"]) <= 2000, f
            assert len(block.get("fields", [])) <= 10, block
        elif kind == "context":
            elements = block.get("elements")
            assert isinstance(elements, list), block
            assert 0 < len(elements) <= 10, block
            for e in elements:
                assert e["type"] in ("mrkdwn", "plain_text"), e
                assert e["text"], e
        else:
            raise AssertionError(f"unexpected block type {kind!r}: {block}")


def slack_of(receiver: Receiver, reason: str, target: str) -> list[Received]:
    """Slack posts whose context names ``reason`` and whose header names ``target``."""
    out = []
    for post in receiver.at("/slack"):
        blocks = post.body.get("blocks") or []
        header = next((b["text"]["text"] for b in blocks if b.get("type") == "header"), "")
        context = " ".join(
            e.get("text", "") for b in blocks if b.get("type") == "context" for e in b.get("elements", [])
        )
        if context.endswith(f"· {reason}") and target in header:
            out.append(post)
    return out


# ---- the test ------------------------------------------------------------------------------------


def test_warnings_reach_webhooks_once_and_keep_stops_the_reclaim(
    cluster: Cluster,
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],  # noqa: F811
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    secret_dir = tmp_path / "notify-secret"
    secret_dir.mkdir()
    (secret_dir / "ce").write_text(receiver.base_url + "/ce\n")
    (secret_dir / "slack").write_text(receiver.base_url + "/slack\n")

    apps.create_namespaced_deployment(namespace, deployment(namespace, "nb-a", "idle", gpu_nodes))
    apps.create_namespaced_deployment(namespace, deployment(namespace, "nb-b", "idle", gpu_nodes))
    name = create_policy(
        k8s,
        policies,
        policy_body(
            f"notify-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "6s", "warningPeriod": f"{WARNING_PERIOD_S}s"},
            # The default for a Deployment: scale it to zero (policy_body sets Evict for other tests).
            reclaim={"actions": {"Deployment": "ScaleToZero"}},
            notify=[
                {"name": "ce", "type": "CloudEvents", "urlSecretKey": "ce"},
                {"name": "slack", "type": "Slack", "urlSecretKey": "slack"},
            ],
        ),
    )
    metrics_port = free_port()
    operator = start_operator("--notify-secret-dir", str(secret_dir), "--metrics-port", str(metrics_port))

    pod_a = pod_name(wait_for(lambda: running_pod(core, namespace, "nb-a"), 60, what="nb-a running"))
    pod_b = pod_name(wait_for(lambda: running_pod(core, namespace, "nb-b"), 60, what="nb-b running"))

    # ---- B: warned, then kept with one command right away -------------------------------------
    deadline_b = str(
        wait_for(
            lambda: pod_annotations(core, namespace, pod_b).get(names.EVICT_AFTER), 120, what="nb-b's warning"
        )
    )
    kept = cli(cluster, "keep", f"{namespace}/{pod_b}", "4h")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert time.time() < (parse_rfc3339(deadline_b) or 0), "the keep command came after B's deadline"

    # ---- A: warned, and its pending eviction is a series on /metrics while warned ---------------
    warned = wait_for(lambda: warned_annotations(core, namespace, pod_a), 60, what="nb-a's warning")
    deadline_a = warned[names.EVICT_AFTER]
    # The warning's annotation ends with the one line that keeps the GPU, as its event does.
    assert warned.get(names.RECOMMENDATION, "").endswith(f"To keep it: {keep_line(namespace, pod_a)}"), warned
    series = wait_for(lambda: pending(metrics_port, name, pod_a), 20, what="A's pending-eviction series")
    assert len(series) == 1, series
    labels, value = series[0]
    assert labels["namespace"] == namespace, labels
    assert labels["deadline"] == deadline_a, labels
    assert labels["owner"] == "deployment/nb-a", labels
    assert value == parse_rfc3339(deadline_a), (value, deadline_a)

    # The keep withdraws B's warning: annotation and series go, the acknowledgement is recorded.
    wait_for(
        lambda: names.EVICT_AFTER not in (a := pod_annotations(core, namespace, pod_b)) and a,
        20,
        what="nb-b's evict-after withdrawn after the keep",
    )
    wait_for(lambda: no_pending(metrics_port, name, pod_b), 20, what="B's pending series gone")

    # ---- one CloudEvent per warning, with the fields a person needs ------------------------------
    for pod, deadline in ((pod_a, deadline_a), (pod_b, deadline_b)):
        subject = f"namespaces/{namespace}/pods/{pod}"
        post = wait_for(
            partial(receiver.cloudevents, SCHEDULED, subject), 30, what=f"the warning CloudEvent of {pod}"
        )[0]
        assert post.headers.get("content-type", "").startswith("application/cloudevents+json"), post.headers
        event, data = post.body, post.body["data"]
        assert event["specversion"] == "1.0", event
        assert event["source"] == f"/apis/{GROUP}/{VERSION}/{PLURAL}/{name}", event
        assert event["id"], event
        assert event["time"], event
        assert data["deadline"] == deadline, (data, deadline)
        assert data["acknowledge"] == keep_line(namespace, pod), data
        assert data["namespace"] == namespace, data
        assert data["pod"] == pod, data
        assert data["owner"] == f"deployment/{pod.rsplit('-', 2)[0]}", data
        assert data["node"] in gpu_nodes.names, data
        assert data["verdict"] == "Idle", data
        assert data["gpus"], data
        assert data["why"].startswith("its GPU has done no work"), data
        assert data["message"].endswith(keep_line(namespace, pod)), data
        events = warning_events(core, namespace, pod)
        assert [e.count or 1 for e in events] == [1], [(e.message, e.count) for e in events]
        assert str(events[0].message).endswith(f"To keep it: {keep_line(namespace, pod)}"), events[0].message
        assert events[0].message == data["message"], (events[0].message, data["message"])

        slack = wait_for(
            partial(slack_of, receiver, names.EV_EVICTION_SCHEDULED, pod),
            30,
            what=f"Slack warning of {pod}",
        )
        assert len(slack) == 1, [s.body for s in slack]
        assert slack[0].headers.get("content-type", "").startswith("application/json"), slack[0].headers
        check_slack_blocks(slack[0].body)
        assert slack[0].body["text"].endswith(f"To keep it: {keep_line(namespace, pod)}"), slack[0].body
        section = "\n".join(
            b["text"]["text"] for b in slack[0].body["blocks"] if b["type"] == "section" and "text" in b
        )
        assert f"*Keep it:* run `{keep_line(namespace, pod)}`" in section, section
        assert f"*When:* {deadline}" in section, section

    # ---- A is reclaimed (scaled to zero), B never is ----------------------------------------------
    wait_for(lambda: replicas(apps, namespace, "nb-a") == 0, 90, what="nb-a scaled to zero")
    subject_a = f"namespaces/{namespace}/deployments/nb-a"
    reclaimed = wait_for(
        lambda: receiver.cloudevents(RECLAIMED, subject_a), 30, what="the GPUReclaimed CloudEvent of nb-a"
    )[0]
    data = reclaimed.body["data"]
    assert (data["kind"], data["name"], data["namespace"]) == ("Deployment", "nb-a", namespace), data
    assert data["pod"] == pod_a, data
    assert data["acknowledge"] is None, data
    assert f"gpu-efficiency restore deployment/nb-a -n {namespace}" in data["restore"], data
    warned_a = receiver.cloudevents(SCHEDULED, f"namespaces/{namespace}/pods/{pod_a}")[0]
    assert warned_a.at <= reclaimed.at, "the reclaim was posted before the warning"
    slack_reclaim = wait_for(
        lambda: slack_of(receiver, names.EV_RECLAIMED, "deployment/nb-a"), 30, what="Slack reclaim of nb-a"
    )
    check_slack_blocks(slack_reclaim[0].body)
    wait_for(
        lambda: no_pending(metrics_port, name, pod_a), 30, what="A's pending series gone after the reclaim"
    )

    # Past B's original deadline and a few cycles more: B is untouched and still kept.
    time.sleep(max(0.0, (parse_rfc3339(deadline_b) or 0) - time.time()) + 10)
    assert replicas(apps, namespace, "nb-b") == 1
    kept_b = pod_annotations(core, namespace, pod_b)
    assert kept_b, f"pod {pod_b} is gone"
    assert names.EVICT_AFTER not in kept_b, kept_b
    assert kept_b.get(names.KEEP_FOR) == "4h", kept_b
    assert names.KEEP_SEEN in kept_b, kept_b
    assert no_pending(metrics_port, name, pod_b)

    # ---- exactly one CloudEvent per warning and per action, nothing else -------------------------
    ce = receiver.at("/ce")
    kinds = sorted((p.body["type"], p.body["subject"]) for p in ce)
    assert kinds == sorted(
        [
            (SCHEDULED, f"namespaces/{namespace}/pods/{pod_a}"),
            (SCHEDULED, f"namespaces/{namespace}/pods/{pod_b}"),
            (RECLAIMED, subject_a),
        ]
    ), kinds
    assert len({p.body["id"] for p in ce}) == len(ce), "a CloudEvent id was repeated"
    assert len(receiver.at("/slack")) == 3, [p.body.get("text") for p in receiver.at("/slack")]

    # ---- delivery metrics and the policy condition -----------------------------------------------
    assert notification_counts(metrics_port, name, "sent") == {"ce": 3.0, "slack": 3.0}
    for result in ("failed", "dropped"):
        assert notification_counts(metrics_port, name, result) == {"ce": 0.0, "slack": 0.0}, result
    healthy = wait_for(lambda: condition(k8s, name, names.COND_NOTIFY), 40, what="NotificationsHealthy")
    assert healthy["status"] == "True", healthy
    assert operator.alive()
    assert operator.log().count("cycle failed") == 0
    print(
        f"\nnotifications: {len(ce)} CloudEvents, {len(receiver.at('/slack'))} Slack posts; "
        f"A's warning posted ~{warned_a.at - (parse_rfc3339(deadline_a) or 0) + WARNING_PERIOD_S:.1f}s "
        f"after its cycle wrote it"
    )
