"""Notifications for the people whose GPUs are judged: what happened, why in plain words, when, and
the one line that keeps the GPU. Pure: it turns the actions a cycle carried out into messages
(``Notification``); actuators/notify/ encodes them (``wire.py``: CloudEvents, Slack) and posts them.

The people who own notebooks and training jobs do not watch Kubernetes events, so the same warning
goes to the webhooks their admins configured (``spec.notify``), filtered by reason and namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.status import Condition
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.conditions import flip_condition, set_condition
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    EvictPod,
    NodeEvent,
    OwnerEvent,
    Plan,
    PodEvent,
    PodVerdict,
    PodView,
    PolicyEvent,
    ReclaimOwner,
    Snapshot,
)
from gpu_efficiency.engine.notify.routes import slack_routes
from gpu_efficiency.engine.reclaim.acknowledge import keep_command
from gpu_efficiency.engine.reclaim.owners import BARE, resolve_owner, restore_commands

#: CloudEvents ``type`` prefix (reverse DNS of the API group); the event reason follows.
CLOUDEVENT_TYPE_PREFIX = "io.gpuefficiency."
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
#: Slack Block Kit limits (https://api.slack.com/reference/block-kit/blocks).
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000
SLACK_FIELD_MAX = 2000

#: The headline of each reason, in the words of the person who owns the workload.
TITLES: Mapping[str, str] = {
    names.EV_EVICTION_SCHEDULED: "GPU about to be reclaimed",
    names.EV_EVICTED: "Pod evicted to free its idle GPU",
    names.EV_RECLAIMED: "Idle GPU reclaimed",
    names.EV_EVICTION_BLOCKED: "Reclaiming an idle GPU was refused",
    names.EV_ACTIVE_AGAIN: "GPU working again: reclaim cancelled",
    names.EV_IDLE: "GPU idle",
    names.EV_UNDERUTILIZED: "GPU underused",
    names.EV_RECLAIM_SKIPPED: "Idle GPU not reclaimed",
    names.EV_RECLAIM_INEFFECTIVE: "Evicted pod came back idle: left alone",
    names.EV_RECLAIM_REVERTED: "Reclaimed workload put back without restore",
    names.EV_FAULT: "GPU fault detected",
    names.EV_TAINTED: "Node taken out of scheduling (GPU fault)",
    names.EV_UNTAINTED: "Node back in scheduling",
}


@dataclass(frozen=True, slots=True)
class Notification:
    """One warning or action, with what a person (or a receiving system) needs to act on it."""

    reason: str  # the Kubernetes event reason
    type: str  # Normal | Warning
    policy: str
    time: float  # unix seconds
    kind: str  # Pod | Node | the owner's kind (Deployment, Notebook, ...)
    name: str
    uid: str  # of the object (a node's name for nodes)
    message: str  # the event's message: plain words first, numbers second
    namespace: str = ""  # "" for nodes
    pod: str = ""
    owner: str = ""  # "deployment/nb"; "" for a bare pod or a node
    node: str = ""
    gpus: tuple[str, ...] = ()
    verdict: str = ""
    diagnosis: str = ""
    why: str = ""  # plain words: why the operator acts
    idle_since: float | None = None
    deadline: float | None = None  # when the GPU is reclaimed unless kept
    acknowledge: str = ""  # the command that keeps the GPU ("" when none applies)
    restore: str = ""  # the command that undoes a reclaim
    channel: str = ""  # the namespace's notify-channel annotation (Slack)
    slack_url_key: str = ""  # the namespace's own Slack webhook (a notify Secret key; "": the sink's)
    link: str = ""  # the signed self-service page of a warned pod (keep or release it), "" when off

    @property
    def dedupe_key(self) -> str:
        """Same object, reason and deadline: the same warning (sent once). Without a deadline the
        message tells two occurrences apart."""
        when = format_rfc3339(self.deadline) if self.deadline is not None else self.message
        return f"{self.uid}|{self.reason}|{when}"

    @property
    def id(self) -> str:
        """Stable for one warning, so a receiver can drop a duplicate delivery too."""
        return hashlib.sha256(f"{self.policy}|{self.dedupe_key}".encode()).hexdigest()[:32]

    @property
    def subject(self) -> str:
        if self.kind == "Node":
            return f"nodes/{self.name}"
        resource = "pods" if self.kind == "Pod" else f"{self.kind.lower()}s"
        return f"namespaces/{self.namespace}/{resource}/{self.name}"

    @property
    def target(self) -> str:
        """``team-a/nb-0``, ``deployment/nb in team-a`` or ``node gpu-1``: for headlines."""
        if self.kind == "Node":
            return f"node {self.name}"
        if self.kind == "Pod":
            return f"{self.namespace}/{self.name}"
        return f"{self.kind.lower()}/{self.name} in {self.namespace}"


@dataclass(frozen=True, slots=True)
class _PodContext:
    pod: PodView | None
    verdict: PodVerdict | None
    annotations: Mapping[str, str]  # after this cycle's patch


class _Index:
    """What the cycle knew of each pod, looked up only for the few pods notified."""

    def __init__(self, snapshot: Snapshot, plan: Plan) -> None:
        self.snapshot = snapshot
        self.pods = {p.uid: p for p in snapshot.pods}
        self.verdicts = {(v.namespace, v.name): v for v in plan.verdicts}
        self.patches: dict[str, dict[str, str | None]] = {}
        for action in plan.actions:
            if isinstance(action, AnnotatePod):
                self.patches.setdefault(action.uid, {}).update(action.annotations)
        self.channels = {
            ns.name: ns.annotations.get(names.NOTIFY_CHANNEL, "").strip() for ns in snapshot.namespaces
        }
        self.slack_keys = slack_routes(snapshot.namespaces).keys

    def context(self, uid: str, namespace: str, name: str) -> _PodContext:
        pod = self.pods.get(uid)
        merged: dict[str, str] = dict(pod.annotations) if pod is not None else {}
        for key, value in self.patches.get(uid, {}).items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return _PodContext(pod, self.verdicts.get((namespace, name)), merged)

    def owner_label(self, pod: PodView | None) -> str:
        if pod is None:
            return ""
        owner = resolve_owner(pod, self.snapshot.owners or {})
        return "" if owner.ref.kind == BARE or not owner.ref.name else owner.label


def _idle_words(idle_since: float | None, now: float, window_s: float) -> str:
    if idle_since is None:
        return "its GPU has done no work"
    return f"its GPU has done no work for {format_duration(now - idle_since + window_s)}"


def notifications(
    done: Sequence[Action],
    first_refusals: Sequence[EvictPod],
    snapshot: Snapshot,
    plan: Plan,
    *,
    window_s: float,
    max_keep_s: float,
    keep_allowed: bool,
) -> list[Notification]:
    """The notifications of the actions a cycle carried out (``done``: the API accepted them) and of
    the evictions refused for the first time, in the order they happened."""
    index = _Index(snapshot, plan)
    now, policy = snapshot.now, snapshot.policy_name
    cycle = _Cycle(index, now, policy, window_s, max_keep_s, keep_allowed)
    out: list[Notification] = []
    for action in [*done, *first_refusals]:
        refused = action in first_refusals and action not in done
        if isinstance(action, PodEvent):
            out.append(
                _pod_notification(
                    cycle,
                    namespace=action.namespace,
                    name=action.name,
                    uid=action.uid,
                    reason=action.reason,
                    type_=action.type,
                    message=action.message,
                )
            )
        elif isinstance(action, EvictPod):
            reason = names.EV_EVICTION_BLOCKED if refused else names.EV_EVICTED
            message = (
                f"the pod could not be evicted (a PodDisruptionBudget or the API refused it); "
                f"retried next cycle. {action.reason}"
                if refused
                else action.reason
            )
            out.append(
                _pod_notification(
                    cycle,
                    namespace=action.namespace,
                    name=action.name,
                    uid=action.uid,
                    reason=reason,
                    type_="Warning",
                    message=message,
                )
            )
        elif isinstance(action, ReclaimOwner):
            out.append(_owner_notification(index, action, now, policy, window_s))
        elif isinstance(action, OwnerEvent):
            owner = action.owner
            out.append(
                Notification(
                    reason=action.reason,
                    type=action.type,
                    policy=policy,
                    time=now,
                    kind=owner.kind,
                    name=owner.name,
                    uid=owner.uid,
                    message=action.message,
                    namespace=action.namespace,
                    owner=f"{owner.kind.lower()}/{owner.name}",
                    why=action.message.split(":")[0],
                    slack_url_key=index.slack_keys.get(action.namespace, ""),
                )
            )
        elif isinstance(action, NodeEvent):
            out.append(
                Notification(
                    reason=action.reason,
                    type=action.type,
                    policy=policy,
                    time=now,
                    kind="Node",
                    name=action.node,
                    uid=action.node,
                    message=action.message,
                    node=action.node,
                    why=action.message.split(":")[0],
                )
            )
    return [n for n in out if n.reason in TITLES]


@dataclass(frozen=True, slots=True)
class _Cycle:
    """What every notification of one cycle shares."""

    index: _Index
    now: float
    policy: str
    window_s: float
    max_keep_s: float
    keep_allowed: bool


def _pod_notification(
    cycle: _Cycle, *, namespace: str, name: str, uid: str, reason: str, type_: str, message: str
) -> Notification:
    index, now, policy = cycle.index, cycle.now, cycle.policy
    ctx = index.context(uid, namespace, name)
    verdict = ctx.verdict
    idle_since = parse_rfc3339(ctx.annotations.get(names.IDLE_SINCE))
    deadline = parse_rfc3339(ctx.annotations.get(names.EVICT_AFTER))
    idle_reason = reason in (
        names.EV_EVICTION_SCHEDULED,
        names.EV_EVICTED,
        names.EV_IDLE,
        names.EV_EVICTION_BLOCKED,
    )
    if idle_reason:
        why = _idle_words(idle_since, now, cycle.window_s)
    elif verdict is not None and verdict.recommendation:
        why = f"{verdict.diagnosis.value.replace('-', ' ')}: {verdict.recommendation}"
    else:
        why = message.split(":")[0]
    warning = reason == names.EV_EVICTION_SCHEDULED
    return Notification(
        reason=reason,
        type=type_,
        policy=policy,
        time=now,
        kind="Pod",
        name=name,
        uid=uid,
        message=message,
        namespace=namespace,
        pod=name,
        owner=index.owner_label(ctx.pod),
        node=ctx.pod.node if ctx.pod is not None else "",
        gpus=verdict.gpus if verdict is not None else (),
        verdict=verdict.verdict.value if verdict is not None else "",
        diagnosis=verdict.diagnosis.value if verdict is not None else "",
        why=why,
        idle_since=idle_since,
        deadline=deadline if warning or reason == names.EV_EVICTION_BLOCKED else None,
        acknowledge=keep_command(namespace, name, cycle.max_keep_s) if warning and cycle.keep_allowed else "",
        channel=index.channels.get(namespace, ""),
        slack_url_key=index.slack_keys.get(namespace, ""),
        link=ctx.annotations.get(names.SELF_SERVICE, "") if warning else "",
    )


def _owner_notification(
    index: _Index, action: ReclaimOwner, now: float, policy: str, window_s: float
) -> Notification:
    nodes: list[str] = []
    gpus: list[str] = []
    idle: list[float] = []
    for pod_name, pod_uid in action.pods:
        ctx = index.context(pod_uid, action.namespace, pod_name)
        if ctx.pod is not None and ctx.pod.node not in nodes:
            nodes.append(ctx.pod.node)
        if ctx.verdict is not None:
            gpus.extend(g for g in ctx.verdict.gpus if g not in gpus)
        since = parse_rfc3339(ctx.annotations.get(names.IDLE_SINCE))
        if since is not None:
            idle.append(since)
    owner = action.owner
    idle_since = max(idle) if idle else None  # the owner is idle since its last pod went idle
    return Notification(
        reason=names.EV_RECLAIMED,
        type="Warning",
        policy=policy,
        time=now,
        kind=owner.kind,
        name=owner.name,
        uid=owner.uid or f"{action.namespace}/{owner.kind}/{owner.name}",
        message=f"{action.action} {owner.kind.lower()}/{owner.name}: {action.reason}",
        namespace=action.namespace,
        pod=", ".join(name for name, _ in action.pods),
        owner=f"{owner.kind.lower()}/{owner.name}",
        node=", ".join(nodes),
        gpus=tuple(gpus),
        verdict="Idle",
        diagnosis="idle",
        why=_idle_words(idle_since, now, window_s),
        idle_since=idle_since,
        restore=restore_commands(action.namespace, owner.kind, owner.name),
        channel=index.channels.get(action.namespace, ""),
        slack_url_key=index.slack_keys.get(action.namespace, ""),
    )


# ---- what the cycle exports and reports about notifications --------------------------------------


def pending_evictions(snapshot: Snapshot, plan: Plan) -> dict[tuple[str, ...], float]:
    """(namespace, pod, owner, deadline) -> deadline (unix seconds) of every pod this policy judged
    that carries a warning after this cycle's writes, except pods acted on in this cycle."""
    index = _Index(snapshot, plan)
    judged = {(v.namespace, v.name) for v in plan.verdicts}
    acted = {a.uid for a in plan.actions if isinstance(a, EvictPod)}
    for action in plan.actions:
        if isinstance(action, ReclaimOwner):
            acted.update(uid for _, uid in action.pods)
    pending: dict[tuple[str, ...], float] = {}
    for pod in snapshot.pods:
        if (pod.namespace, pod.name) not in judged or pod.uid in acted:
            continue
        if names.EVICT_AFTER not in pod.annotations and pod.uid not in index.patches:
            continue  # the common case: nothing pending, nothing written
        ctx = index.context(pod.uid, pod.namespace, pod.name)
        deadline = parse_rfc3339(ctx.annotations.get(names.EVICT_AFTER))
        if deadline is not None:
            key = (pod.namespace, pod.name, index.owner_label(pod), format_rfc3339(deadline))
            pending[key] = deadline
    return pending


def notifications_condition(
    conditions: Sequence[Condition],
    failures: Mapping[str, str],
    *,
    sinks: int,
    now: float,
    generation: int,
    misrouted: Mapping[str, str] | None = None,
) -> tuple[list[Condition], PolicyEvent | None]:
    """The NotificationsHealthy condition (absent without sinks), and the NotificationFailed event
    its flip to False calls for. ``failures``: sink name -> why its last delivery failed;
    ``misrouted``: namespace -> why its own Slack webhook annotation is ignored."""
    if sinks == 0:
        return [c for c in conditions if c.type != names.COND_NOTIFY], None
    if misrouted and not failures:
        message = "; ".join(f"namespace {ns}: {why}" for ns, why in sorted(misrouted.items()))
        return _unhealthy(
            conditions,
            reason="SlackRouteInvalid",
            headline="notifications are not routed as asked",
            message=message,
            now=now,
            generation=generation,
        )
    if not failures:
        return set_condition(
            conditions,
            type=names.COND_NOTIFY,
            status="True",
            reason="Delivering",
            message=f"{sinks} sink(s): no failed delivery",
            now=now,
            generation=generation,
        ), None
    message = "; ".join(
        [f"sink {name}: {why}" for name, why in sorted(failures.items())]
        + [f"namespace {ns}: {why}" for ns, why in sorted((misrouted or {}).items())]
    )
    return _unhealthy(
        conditions,
        reason="DeliveryFailed",
        headline="notifications are not delivered",
        message=message,
        now=now,
        generation=generation,
    )


def _unhealthy(
    conditions: Sequence[Condition], *, reason: str, headline: str, message: str, now: float, generation: int
) -> tuple[list[Condition], PolicyEvent | None]:
    """NotificationsHealthy=False, with the NotificationFailed event when it turns False."""
    return flip_condition(
        conditions,
        type=names.COND_NOTIFY,
        status="False",
        reason=reason,
        message=message,
        now=now,
        generation=generation,
        event=PolicyEvent(
            reason=names.EV_NOTIFICATION_FAILED, message=f"{headline}: {message}", type="Warning"
        ),
    )
