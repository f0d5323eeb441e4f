"""Put the signed self-service link into a cycle's warnings (pure): the pod annotation
``gpuefficiency.io/self-service``, the GPUIdleEvictionScheduled event, and through the annotation
the CloudEvent and the Slack message (engine/notify/messages.py reads it).

Applied to the engine's plan after it is made, so the engine itself never holds the key. The token
expires at the pod's ``evict-after``; a pod whose deadline moved gets a new link, one whose warning
was withdrawn loses it, and a warned pod that has the right link gets no write (steady state).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine import ending_with
from gpu_efficiency.engine.model import Action, AnnotatePod, EvictPod, Plan, PodEvent, PodView, Snapshot
from gpu_efficiency.selfservice.tokens import Claims, link, sign

KEEP_TAIL = ". To keep it: "


@dataclass(frozen=True, slots=True)
class Linker:
    """The key and the page's public base URL (``--selfservice-url``)."""

    key: bytes
    base_url: str

    def url(self, pod: PodView, policy: str, deadline: float) -> str:
        claims = Claims(
            namespace=pod.namespace, pod=pod.name, uid=pod.uid, policy=policy, expires=int(deadline)
        )
        return link(self.base_url, sign(self.key, claims))


def with_link(message: str, url: str) -> str:
    """The warning's text with the link before its kubectl line, both kept whole within the event limit."""
    head, sep, command = message.partition(KEEP_TAIL)
    return ending_with(head, f". Keep it or give it back: {url}" + (sep + command if sep else ""))


def with_links(plan: Plan, snapshot: Snapshot, linker: Linker) -> Plan:
    """``plan`` with each warned pod's link written and told (see the module docstring)."""
    patches: dict[str, dict[str, str | None]] = {}
    for action in plan.actions:
        if isinstance(action, AnnotatePod):
            patches.setdefault(action.uid, {}).update(action.annotations)
    judged = {(v.namespace, v.name) for v in plan.verdicts}
    acted = {a.uid for a in plan.actions if isinstance(a, EvictPod)}
    wanted: dict[str, str | None] = {}
    for pod in snapshot.pods:
        if (pod.namespace, pod.name) not in judged or pod.uid in acted:
            continue
        patch = patches.get(pod.uid, {})
        current = pod.annotations.get(names.SELF_SERVICE)
        if current is None and names.EVICT_AFTER not in pod.annotations and names.EVICT_AFTER not in patch:
            continue  # the common case: no warning, no link
        text = (
            patch[names.EVICT_AFTER] if names.EVICT_AFTER in patch else pod.annotations.get(names.EVICT_AFTER)
        )
        deadline = parse_rfc3339(text)
        if deadline is not None and deadline <= snapshot.now:
            continue  # the deadline passed: the link has expired, and the pod is being reclaimed
        want = linker.url(pod, snapshot.policy_name, deadline) if deadline is not None else None
        if want != current:
            wanted[pod.uid] = want
    if not wanted:
        return plan
    by_uid = {p.uid: p for p in snapshot.pods}
    actions: list[Action] = []
    for uid, url in wanted.items():
        if uid not in patches:
            pod = by_uid[uid]
            actions.append(
                AnnotatePod(
                    namespace=pod.namespace, name=pod.name, uid=uid, annotations={names.SELF_SERVICE: url}
                )
            )
    for action in plan.actions:
        if isinstance(action, AnnotatePod) and action.uid in wanted:
            action = replace(
                action, annotations={**action.annotations, names.SELF_SERVICE: wanted[action.uid]}
            )
        elif isinstance(action, PodEvent) and action.reason == names.EV_EVICTION_SCHEDULED:
            url = wanted.get(action.uid)
            if url:
                action = replace(action, message=with_link(action.message, url))
        actions.append(action)
    return replace(plan, actions=tuple(actions))
