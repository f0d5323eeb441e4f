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

from gpu_efficiency.actuators.notify.delivery import Timing
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.timefmt import parse_rfc3339
from tests.e2e.harness import Cluster, wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_operator import (
    condition,
    create_policy,
    deployment,
    policies,  # noqa: F401
    policy_body,
    policy_events,
    running_pod,
)
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

SCHEDULED = "io.gpuefficiency." + names.EV_EVICTION_SCHEDULED
RECLAIMED = "io.gpuefficiency." + names.EV_RECLAIMED
WARNING_PERIOD_S = 30  # room for the keep command (a Python start) well before the deadline
SEND_TIMEOUT_S = Timing().timeout_s  # one webhook post's limit (also a cycle-duration bucket bound)


# ---- the webhook receiver ------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    status: int = 200  # what the receiver answered (0: it never answered)


@dataclass
class Receiver:
    """Records every POST (path, headers, JSON body) and answers 200, or as told: 500 to the first
    ``fail_first[path]`` posts to a path, and never to posts to a path in ``hang`` (until the test
    ends)."""

    server: ThreadingHTTPServer
    posts: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fail_first: dict[str, int] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def cloudevents(
        self, type_: str | None = None, subject: str | None = None, path: str = "/ce"
    ) -> list[Received]:
        return [
            p
            for p in self.at(path)
            if (type_ is None or p.body.get("type") == type_)
            and (subject is None or p.body.get("subject") == subject)
        ]

    def answered(self, path: str, count: int) -> list[Received] | None:
        """The posts to ``path`` answered 200, once there are at least ``count``."""
        found = [p for p in self.at(path) if p.status == 200]
        return found if len(found) >= count else None

    def answer(self, path: str) -> int:
        """The status for the next post to ``path`` (0: hang); call with the lock held."""
        if path in self.hang:
            return 0
        earlier = sum(1 for p in self.posts if p.path == path)
        return 500 if earlier < self.fail_first.get(path, 0) else 200


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
            headers = {k.lower(): v for k, v in self.headers.items()}
            with holder[0].lock:
                status = holder[0].answer(self.path)
                holder[0].posts.append(Received(self.path, headers, body, time.time(), status))
            if status == 0:
                holder[0].released.wait(300)  # far past the operator's send timeout
                self.close_connection = True
                return
            self.send_response(status)
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
        holder[0].released.set()
        server.shutdown()
        server.server_close()


# ---- the operator's /metrics ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Samples = list[tuple[dict[str, str], float]]


def scrape(port: int) -> str | None:
    """The operator's /metrics page (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def named(text: str, name: str) -> Samples:
    """The samples named ``name`` in one /metrics page."""
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def samples(port: int, name: str) -> Samples | None:
    """The operator's samples named ``name`` (None while /metrics does not answer)."""
    text = scrape(port)
    return None if text is None else named(text, name)


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


@dataclass(frozen=True)
class CycleTimes:
    """The policy's gpu_efficiency_cycle_duration_seconds histogram at one moment."""

    count: float
    total_s: float
    slower_than_send_timeout: float  # cycles longer than one webhook post may take (5 s)

    def mean_since(self, earlier: CycleTimes) -> tuple[float, int]:
        """Mean duration and number of the cycles between ``earlier`` and this snapshot."""
        n = int(self.count - earlier.count)
        assert n > 0, f"no cycle between the snapshots ({earlier} -> {self})"
        return (self.total_s - earlier.total_s) / n, n


def cycle_times(port: int, policy: str) -> CycleTimes | None:
    """The policy's cycle-duration histogram (None while /metrics does not answer or has none).

    Count, sum and buckets come from one page: read from three, a cycle ending between the reads
    made "cycles over 5 s" (count minus the 5 s bucket) -1."""
    text = scrape(port)
    if text is None:
        return None
    found = named(text, "gpu_efficiency_cycle_duration_seconds_count")
    total = named(text, "gpu_efficiency_cycle_duration_seconds_sum")
    buckets = named(text, "gpu_efficiency_cycle_duration_seconds_bucket")
    if not found or not total or not buckets:
        return None
    count = next((v for labels, v in found if labels.get("policy") == policy), None)
    total_s = next((v for labels, v in total if labels.get("policy") == policy), None)
    within = next(
        (
            v
            for labels, v in buckets
            if labels.get("policy") == policy and float(labels["le"]) == SEND_TIMEOUT_S
        ),
        None,
    )
    if count is None or total_s is None or within is None:
        return None
    return CycleTimes(count, total_s, count - within)


def cycles_after(port: int, policy: str, count: int) -> CycleTimes | None:
    """The policy's cycle-duration histogram once it has counted ``count`` cycles."""
    found = cycle_times(port, policy)
    return found if found is not None and found.count >= count else None


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


def events_of(core: client.CoreV1Api, namespace: str, pod: str, reason: str) -> list[client.CoreV1Event]:
    return [
        e
        for e in core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items
        if e.reason == reason
    ]


def unwarned_annotations(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str] | None:
    """The pod's annotations once it carries no warning (None while it does, or is gone)."""
    found = pod_annotations(core, namespace, name)
    return found if found and names.EVICT_AFTER not in found else None


def warning_events(core: client.CoreV1Api, namespace: str, pod: str) -> list[client.CoreV1Event]:
    return events_of(core, namespace, pod, names.EV_EVICTION_SCHEDULED)


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


# ---- failing sinks, and keep-for's bound ---------------------------------------------------------

KEEP_WARNING_S = 20  # warningPeriod: room to annotate both pods (an API call) before the deadline
MAX_KEEP_S = 30  # maxKeep: past the first deadline, well short of keep-for=4h
INTERVAL_S = 3  # policy_body's interval


def test_failing_sinks_never_slow_a_cycle_and_keep_for_is_bounded_by_max_keep(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],  # noqa: F811
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """One sink answers 500 twice then 200, one never answers: the first is retried until it gets
    the CloudEvent, the second fails (metric, condition, event), and the cycles while both fail take
    as long as the cycles before any post. Meanwhile two warned pods are acknowledged: ``keep-for=soon``
    is reported and changes nothing, ``keep-for=4h`` withdraws the warning only until ``maxKeep``."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    receiver.fail_first["/flaky"] = 2
    receiver.hang.add("/stuck")
    secret_dir = tmp_path / "notify-secret"
    secret_dir.mkdir()
    (secret_dir / "flaky").write_text(receiver.base_url + "/flaky\n")
    (secret_dir / "stuck").write_text(receiver.base_url + "/stuck\n")

    apps.create_namespaced_deployment(namespace, deployment(namespace, "nb-bad", "idle", gpu_nodes))
    apps.create_namespaced_deployment(namespace, deployment(namespace, "nb-keep", "idle", gpu_nodes))
    name = create_policy(
        k8s,
        policies,
        policy_body(
            f"sinks-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "6s", "warningPeriod": f"{KEEP_WARNING_S}s", "maxKeep": f"{MAX_KEEP_S}s"},
            reclaim={"actions": {"Deployment": "ScaleToZero"}},
            notify=[
                {"name": "flaky", "type": "CloudEvents", "urlSecretKey": "flaky"},
                {"name": "stuck", "type": "CloudEvents", "urlSecretKey": "stuck"},
            ],
        ),
    )
    metrics_port = free_port()
    operator = start_operator("--notify-secret-dir", str(secret_dir), "--metrics-port", str(metrics_port))
    bad = pod_name(wait_for(lambda: running_pod(core, namespace, "nb-bad"), 60, what="nb-bad running"))
    keep = pod_name(wait_for(lambda: running_pod(core, namespace, "nb-keep"), 60, what="nb-keep running"))

    # Baseline: the cycles after the first (cold) one until the warnings, before any post.
    base_from = wait_for(lambda: cycles_after(metrics_port, name, 2), 60, what="two cycles")
    warned_bad = wait_for(lambda: warned_annotations(core, namespace, bad), 90, what="nb-bad's warning")
    warned_keep = wait_for(lambda: warned_annotations(core, namespace, keep), 30, what="nb-keep's warning")
    failing_from = cycle_times(metrics_port, name)
    assert failing_from is not None
    deadline_bad = parse_rfc3339(warned_bad[names.EVICT_AFTER]) or 0.0
    for pod, value in ((bad, "soon"), (keep, "4h")):
        core.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {names.KEEP_FOR: value}}})
    annotated = time.time()
    assert annotated < deadline_bad, "the acknowledgements came after nb-bad's deadline"

    # ---- keep-for=soon: one clear event, the warning and its deadline stand --------------------
    invalid = wait_for(
        lambda: events_of(core, namespace, bad, names.EV_ACK_INVALID), 20, what="AcknowledgementInvalid"
    )
    cycles_then = (cycle_times(metrics_port, name) or failing_from).count

    def next_cycle_done() -> bool:
        """A whole cycle ran after the event (the one that wrote it may still have been running)."""
        return (cycle_times(metrics_port, name) or failing_from).count >= cycles_then + 2

    assert invalid[0].type == "Warning", invalid[0]
    assert f"{names.KEEP_FOR}='soon' is not a duration: write it like 4h" in str(invalid[0].message), invalid
    assert "nothing else changes" in str(invalid[0].message), invalid[0].message
    wait_for(next_cycle_done, 3 * INTERVAL_S + 10, what="a cycle after the event")
    now_bad = pod_annotations(core, namespace, bad)
    for key in (names.EVICT_AFTER, names.IDLE_SINCE):
        assert now_bad.get(key) == warned_bad[key], (key, now_bad, warned_bad)

    # ---- keep-for=4h: the warning is withdrawn, counted from when the operator first saw it ------
    kept = wait_for(
        lambda: unwarned_annotations(core, namespace, keep), 20, what="nb-keep's warning withdrawn"
    )
    seen = parse_rfc3339(kept.get(names.KEEP_SEEN)) or 0.0
    assert annotated - 2 <= seen <= annotated + 3 * INTERVAL_S + 2, (kept, annotated)
    assert not events_of(core, namespace, keep, names.EV_ACK_INVALID)

    # nb-bad is reclaimed at its deadline, as without the acknowledgement; nb-keep is not.
    wait_for(lambda: replicas(apps, namespace, "nb-bad") == 0, 60, what="nb-bad scaled to zero")
    late = time.time() - deadline_bad
    assert -1 <= late <= 3 * INTERVAL_S + 5, f"nb-bad reclaimed {late:.1f}s after its deadline"
    assert len(events_of(core, namespace, bad, names.EV_ACK_INVALID)) == 1
    assert replicas(apps, namespace, "nb-keep") == 1
    assert names.EVICT_AFTER not in pod_annotations(core, namespace, keep)

    # ---- the hanging sink fails after every attempt; cycles kept their pace meanwhile -------------
    failed = wait_for(
        lambda: notification_counts(metrics_port, name, "failed").get("stuck"), 90, what="stuck: failed"
    )
    failing_to = cycle_times(metrics_port, name)
    assert failing_to is not None
    base_mean, base_n = failing_from.mean_since(base_from)
    fail_mean, fail_n = failing_to.mean_since(failing_from)
    slow = failing_to.slower_than_send_timeout - failing_from.slower_than_send_timeout
    print(
        f"\ncycle duration: baseline {base_mean:.3f}s mean over {base_n} cycles; with a sink answering 500 "
        f"and one hanging {fail_mean:.3f}s mean over {fail_n} cycles ({slow:.0f} over {SEND_TIMEOUT_S:.0f}s)"
    )
    assert fail_mean <= base_mean + max(1.0, 0.5 * base_mean), (base_mean, fail_mean)
    assert slow == 0, f"{slow:.0f} cycles took longer than one post to the hanging sink may"
    assert failed == 1.0, failed
    stuck = receiver.at("/stuck")
    tries = [p for p in stuck if p.body["id"] == stuck[0].body["id"]]
    print(
        f"hanging sink: {len(tries)} attempts at its first CloudEvent over {tries[-1].at - tries[0].at:.1f}s"
    )
    assert len(tries) == Timing().attempts, [p.body["id"] for p in stuck]
    assert stuck[: len(tries)] == tries, "another CloudEvent was posted between the retries"
    assert notification_counts(metrics_port, name, "retried")["stuck"] >= Timing().attempts - 1
    unhealthy = wait_for(
        lambda: (c := condition(k8s, name, names.COND_NOTIFY)) and c["status"] == "False" and c,
        40,
        what="NotificationsHealthy=False",
    )
    assert unhealthy["reason"] == "DeliveryFailed", unhealthy
    assert (
        f"sink stuck: {names.EV_EVICTION_SCHEDULED} not delivered after {Timing().attempts} attempts: "
        in (unhealthy["message"])
    ), unhealthy
    assert "sink flaky" not in unhealthy["message"], unhealthy
    assert wait_for(
        lambda: policy_events(k8s, name, names.EV_NOTIFICATION_FAILED), 30, what="NotificationFailed event"
    )

    # ---- the 500 sink got the first warning on its third attempt, every later one at once -------
    flaky = receiver.at("/flaky")
    first = [p for p in flaky if p.body["id"] == flaky[0].body["id"]]
    attempts = [p.status for p in first]
    print(f"500 sink: first CloudEvent answered {attempts} ({first[-1].at - first[0].at:.1f}s)")
    assert attempts == [500, 500, 200], attempts
    assert notification_counts(metrics_port, name, "retried")["flaky"] == 2.0

    # ---- keep-for=4h holds only until maxKeep from when it was seen, then warning and reclaim -----
    rewarned = wait_for(lambda: warned_annotations(core, namespace, keep), 60, what="nb-keep warned again")
    rewarned_at = (parse_rfc3339(rewarned[names.EVICT_AFTER]) or 0.0) - KEEP_WARNING_S
    print(f"keep-for=4h with maxKeep {MAX_KEEP_S}s: warned again {rewarned_at - seen:.1f}s after it was seen")
    assert seen + MAX_KEEP_S - 1 <= rewarned_at <= seen + MAX_KEEP_S + 3 * INTERVAL_S + 2, (seen, rewarned)
    assert rewarned[names.KEEP_FOR] == "4h", rewarned
    assert rewarned[names.EVICT_AFTER] != warned_keep[names.EVICT_AFTER]
    wait_for(lambda: replicas(apps, namespace, "nb-keep") == 0, 60, what="nb-keep scaled to zero")

    # The 500 sink got each warning and action once (the first after two retries), nothing else.
    subject = f"namespaces/{namespace}"
    expected = sorted(
        [
            (SCHEDULED, f"{subject}/pods/{bad}"),
            (SCHEDULED, f"{subject}/pods/{keep}"),
            (SCHEDULED, f"{subject}/pods/{keep}"),
            (RECLAIMED, f"{subject}/deployments/nb-bad"),
            (RECLAIMED, f"{subject}/deployments/nb-keep"),
        ]
    )
    delivered = wait_for(
        lambda: receiver.answered("/flaky", len(expected)),
        30,
        what="every CloudEvent delivered to the 500 sink",
    )
    assert sorted((p.body["type"], p.body["subject"]) for p in delivered) == expected
    assert len({p.body["id"] for p in delivered}) == len(expected), "a CloudEvent was delivered twice"
    assert len(receiver.at("/flaky")) == len(expected) + 2
    assert notification_counts(metrics_port, name, "sent")["flaky"] == len(expected)
    assert notification_counts(metrics_port, name, "failed")["flaky"] == 0.0
    assert operator.alive()
    assert operator.log().count("cycle failed") == 0
