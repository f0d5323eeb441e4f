"""Idle verdicts grouped by owner: which owners may be reclaimed, and this cycle's reclaim actions.

The pod lifecycle (idle.py) still keeps each pod's clock and warning. This module decides, per top
owner (owners.py), whether those warnings may stand and what happens when they are all due:

* The owner is acted on only when every one of its GPU pods (in scope or not) is Idle, warned and
  past evict-after. One that is busy, Unknown or not judged by this policy holds the whole owner.
* An owner we cannot act on (a controller of a kind we do not know or did not read, or one already
  at 0 replicas, suspended or stopped without a reclamation of ours while its pods run) is no way
  out: its pods are evicted like bare pods. Where ``allowOptOut`` is true that waits ``maxKeep``
  after the warning (unless ``allowBarePods``); if a pod of the same controller comes back and goes
  idle again, it is ReclaimIneffective and left alone (ownerholds.py) instead of evicted in a loop.
* An owner that can never be acted on (Recommend by policy, partly idle, a pod that may never be
  touched, one held by exempt/keep-until, or one left alone after a revert) is a *blocker*: its
  pods' warnings are withdrawn (a warning that cannot come true is a lie) and they carry the
  recommendation instead.
* Budgets count owners: scaling a Deployment of four replicas is one action, like evicting one pod.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.api.status import OwnerHold, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    DisruptionBudget,
    EvictPod,
    NodeView,
    OwnerEvent,
    OwnerKey,
    PendingPod,
    PodEvent,
    PodView,
    PolicyEvent,
    ReclaimOwner,
    Snapshot,
    Verdict,
)
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.budgets import (
    EvictionCandidate,
    cap_reached,
    permanent_blocker,
    temporary_blocker,
)
from gpu_efficiency.engine.reclaim.crd_owners import (
    admitted_by_kueue,
    kueue_admitted,
    kueue_workloads,
    refuse_suspend,
)
from gpu_efficiency.engine.reclaim.idle import PodKey, hold_reason
from gpu_efficiency.engine.reclaim.ownerholds import (
    active_hold,
    came_back,
    find_reverts,
    hold_text,
    ineffective_hold,
)
from gpu_efficiency.engine.reclaim.owners import (
    BARE,
    Owner,
    action_words,
    already_reclaimed,
    choose_action,
    in_reclaimed_state,
    recommendation,
    resolve_owner,
    scheduler_note,
)
from gpu_efficiency.engine.reclaim.pressure import choose_for_pressure, waiting_for_gpus
from gpu_efficiency.engine.reclaim.reclaimproof import (
    draft,
    freed_gpu_ids,
    freed_gpus,
    owner_text,
    waiting_names,
)
from gpu_efficiency.engine.selection import LabelMatcher, compile_selector


@dataclass(slots=True)
class OwnerGroup:
    """One top owner, its GPU pods and what may be done to it this cycle."""

    owner: Owner
    action: ReclaimAction
    why: str  # why Recommend ('' when the policy's action applies)
    pods: list[PodView] = field(default_factory=list)
    idle: int = 0  # pods with the verdict Idle
    blocker: str = ""  # never acted on while this holds: warnings withdrawn
    hold: str = ""  # not acted on this cycle, warnings kept (owners unreadable, already reclaimed)
    disruption_blocked: str = ""  # a PodDisruptionBudget allows too few disruptions: retried
    recommendation: str = ""
    reclaimed: bool = False  # already in its reclaimed state: its pods are on their way out
    #: the owner cannot be acted on: its pods are evicted instead (``why`` says why)
    fallback: bool = False
    autoscaler: str = ""  # the HorizontalPodAutoscaler targeting it ('' when none)

    @property
    def actionable(self) -> bool:
        return self.action is not ReclaimAction.RECOMMEND

    def describe(self) -> str:
        """One line for notes and explain: owner, action and why not (when not)."""
        text = f"owner {self.owner.label}, action {self.action.value}, {self.idle} of {len(self.pods)} GPU pod(s) idle"
        if self.why:
            text += f" ({self.why})"
        why_not = self.blocker or self.hold or self.disruption_blocked
        return text + (f": {why_not}" if why_not else "")


@dataclass(slots=True)
class _Members:
    """One top owner's GPU pods, and how many of them are Idle, before its group is decided."""

    owner: Owner
    pods: list[PodView] = field(default_factory=list)
    idle: int = 0


@dataclass(slots=True)
class OwnerPlan:
    """The owners decided this cycle. Only an owner with an Idle pod, or one our status records as
    reclaimed, has a group: nothing else reads a decision (a pod's group gives its idle lifecycle
    the owner's blocker and action words, ``select_reclaims`` takes the owners of due pods, and
    ``_under_pressure`` counts the terminating pods of reclaimed owners), and deciding all 8,000
    owners of a steady cluster every cycle was a fifth of its plan."""

    groups: dict[OwnerKey, OwnerGroup]
    of_pod: dict[PodKey, OwnerGroup]
    #: GPU UUIDs of each judged pod: pods time-sliced on one GPU free it once, not once each.
    gpu_uuids: Mapping[PodKey, tuple[str, ...]] = field(default_factory=dict)
    #: Owners newly left alone (ReclaimReverted, ReclaimIneffective), for status.ownerHolds.
    new_holds: list[OwnerHold] = field(default_factory=list)
    #: Their events (on the owner or its pods, and on the policy).
    events: list[Action] = field(default_factory=list)


def group_owners(
    snapshot: Snapshot,
    pods: Iterable[PodView],
    verdicts: Mapping[PodKey, Verdict],
    params: CycleParams,
    gpu_uuids: Mapping[PodKey, tuple[str, ...]] | None = None,
) -> OwnerPlan:
    """Group ``pods`` (every GPU pod outside the protected namespaces) by top owner and decide, per
    owner with an Idle pod or a reclamation of ours (``OwnerPlan``), the action and whether it is
    blocked or held. ``verdicts``: this policy's verdicts; ``gpu_uuids``: the GPUs of the pods it
    judged."""
    objects = snapshot.owners or {}
    holds = list(snapshot.status.owner_holds)
    new_holds: list[OwnerHold] = []
    events: list[Action] = []
    if params.enforce and snapshot.owners is not None and not snapshot.owners_error:
        for revert in find_reverts(snapshot.status.reclamations, holds, objects, params, snapshot.now):
            new_holds.append(revert.hold)
            events.append(
                OwnerEvent(
                    namespace=revert.obj.namespace,
                    owner=revert.obj.ref,
                    reason=names.EV_RECLAIM_REVERTED,
                    message=revert.message,
                )
            )
            events.append(
                PolicyEvent(reason=names.EV_RECLAIM_REVERTED, message=revert.message, type="Warning")
            )
    resolved: dict[tuple[str, str, str], Owner] = {}
    members: dict[OwnerKey, _Members] = {}
    workloads = kueue_workloads(objects)
    for pod in pods:
        ref = pod.controller
        cache_key = (pod.namespace, ref.kind, ref.name) if ref is not None else None
        owner = resolved.get(cache_key) if cache_key is not None else None
        if owner is None:
            owner = admitted_by_kueue(resolve_owner(pod, objects), workloads)
            if cache_key is not None:
                resolved[cache_key] = owner
        found = members.get(owner.key)
        if found is None:
            found = members[owner.key] = _Members(owner)
        found.pods.append(pod)
        found.idle += verdicts.get((pod.namespace, pod.name)) is Verdict.IDLE
    reclaimed = {record.owner for record in snapshot.status.reclamations}  # as ``owner_text`` writes it
    groups: dict[OwnerKey, OwnerGroup] = {}
    of_pod: dict[PodKey, OwnerGroup] = {}
    for key, found in members.items():
        if not found.idle and owner_text(key) not in reclaimed:
            continue  # nothing reads its decision (``OwnerPlan``)
        owner = found.owner
        action, why = choose_action(owner, snapshot.policy.reclaim.actions)
        action, why = refuse_suspend(owner, action, why)
        group = groups[key] = OwnerGroup(owner, action, why, found.pods, found.idle, fallback=not owner.known)
        group.autoscaler = snapshot.autoscalers.get(key, "")
        for pod in found.pods:
            of_pod[(pod.namespace, pod.name)] = group
    budgets = [(b, compile_selector(b.selector)) for b in snapshot.disruption_budgets]
    plan = OwnerPlan(groups, of_pod, dict(gpu_uuids or {}), new_holds, events)
    for group in groups.values():
        _decide(group, snapshot, params, [*holds, *new_holds], plan)
        if not group.blocker and not group.hold and group.action is not ReclaimAction.EVICT:
            group.disruption_blocked = _disruption_blocker(group, budgets)
    return plan


def _disruption_blocker(group: OwnerGroup, budgets: list[tuple[DisruptionBudget, LabelMatcher]]) -> str:
    """PodDisruptionBudgets apply to owner actions as to evictions (the Eviction API checks those):
    an owner is not reclaimed while a budget covering its pods allows fewer disruptions than that."""
    for budget, matches in budgets:
        if budget.namespace != group.owner.namespace:
            continue
        covered = sum(1 for pod in group.pods if matches(pod.labels))
        if covered and budget.disruptions_allowed < covered:
            return (
                f"PodDisruptionBudget {budget.name} allows {budget.disruptions_allowed} disruption(s) and "
                f"covers {covered} pod(s) of {group.owner.label}: not reclaimed, retried next cycle"
            )
    return ""


_STATE: Mapping[ReclaimAction, str] = {
    ReclaimAction.SCALE_TO_ZERO: "at 0 replicas",
    ReclaimAction.SUSPEND: "suspended",
    ReclaimAction.STOP: "stopped",
}


def _decide(
    group: OwnerGroup, snapshot: Snapshot, params: CycleParams, holds: list[OwnerHold], plan: OwnerPlan
) -> None:
    owner, total = group.owner, len(group.pods)
    group.recommendation = recommendation(owner, group.idle, total)
    if snapshot.owners_error and owner.ref.kind != BARE:
        group.hold = f"owners could not be read this cycle: {snapshot.owners_error}"
        return
    if not group.actionable:
        group.blocker = f"recommend only ({group.why}): {group.recommendation}"
        return
    held = active_hold(holds, owner.key, snapshot.now)
    if held is not None:
        group.blocker = f"{owner.label} {hold_text(held)}"
        return
    done = already_reclaimed(owner, snapshot.status.reclamations) if owner.known else ""
    if done:
        group.hold = f"{owner.label} already reclaimed ({done}): its pods are going"
        group.reclaimed = True
        return
    obj = owner.obj
    if owner.known and obj is not None and in_reclaimed_state(obj, group.action.value):
        # at 0 replicas (suspended, stopped) yet its pods run, and not by us (a decoy, annotated
        # reclaimed or not): acting on it frees nothing, so its pods are evicted instead
        state = _STATE.get(group.action, "in its reclaimed state")
        group.action = snapshot.policy.reclaim.actions.for_kind(BARE)
        group.why = (
            f"{owner.label} is already {state} but not by this policy and its GPU pods still run: "
            "acting on it frees nothing"
        )
        group.fallback = True
        if not group.actionable:
            group.blocker = f"recommend only ({group.why}): {group.recommendation}"
            return
    if group.idle < total:
        group.blocker = f"{group.recommendation} (never reclaimed while one of its GPU pods is not idle)"
        return
    for pod in group.pods:
        blocker = permanent_blocker(pod, params) or _own_hold(pod, params, snapshot.now)
        if blocker:
            group.blocker = f"pod {pod.namespace}/{pod.name} of {owner.label}: {blocker}"
            return
    if group.fallback and params.enforce:  # Observe reclaims nothing, so nothing comes back
        record = came_back(owner.key, group.pods, snapshot.status.reclamations, holds)
        if record is not None:
            _ineffective(group, record, params, snapshot.now, plan)


def _ineffective(
    group: OwnerGroup, record: Reclamation, params: CycleParams, now: float, plan: OwnerPlan
) -> None:
    """The pods evicted at ``record`` came back under the same owner and are idle again."""
    hold = ineffective_hold(group.owner.key, record, params, now)
    plan.new_holds.append(hold)
    message = (
        f"the GPU pods of {group.owner.label} were evicted at {record.time} ({group.why}), yet a pod of it came "
        f"back and is idle again: evicting it again would loop, so it is left alone until {hold.until} "
        "(maxKeep) or until an admin removes the entry from the policy's status.ownerHolds. Ask its owner "
        "to release the GPU, or give its controller an integration"
    )
    group.blocker = f"{group.owner.label} {hold_text(hold)}"
    for pod in group.pods:
        plan.events.append(
            PodEvent(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                reason=names.EV_RECLAIM_INEFFECTIVE,
                message=message,
                type="Warning",
            )
        )
    plan.events.append(
        PolicyEvent(
            reason=names.EV_RECLAIM_INEFFECTIVE,
            message=f"{group.owner.namespace}/{group.owner.label}: {message}",
            type="Warning",
        )
    )


def _own_hold(pod: PodView, params: CycleParams, now: float) -> str:
    """exempt / keep-until of one pod, which holds its whole owner."""
    ann = pod.annotations
    seen = parse_rfc3339(ann.get(names.KEEP_SEEN)) if names.KEEP_SEEN in ann else now
    return hold_reason(ann, params, now, seen)


@dataclass(frozen=True, slots=True)
class ReclaimSelection:
    actions: tuple[Action, ...]
    notes: tuple[str, ...]
    #: The status record of each reclamation planned, with its actions (kept once one is accepted).
    records: tuple[tuple[tuple[Action, ...], Reclamation], ...] = ()


@dataclass(frozen=True, slots=True)
class Pressure:
    """The cluster as ``reclaimWhen: OnPressure`` weighs it (engine/reclaim/pressure.py)."""

    nodes: Sequence[NodeView]
    pods: Sequence[PodView]  # every GPU pod bound to a node
    pending: Sequence[PendingPod]


def _gpus_by_node(pods: Iterable[PodView]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in pods:
        if pod.node:
            out[pod.node] = out.get(pod.node, 0) + pod.gpu_request
    return out


def select_reclaims(
    plan: OwnerPlan,
    candidates: Iterable[EvictionCandidate],
    params: CycleParams,
    *,
    now: float,
    actions_last_hour: int,
    policy_name: str,
    cluster: Pressure | None = None,
) -> ReclaimSelection:
    """The owners whose GPU pods are all due, within the budgets: longest idle first, then by name.
    With reclaimWhen OnPressure, only those that make GPU pods waiting in ``cluster`` fit (none
    when ``cluster`` is not given: nothing is known to wait)."""
    due: dict[OwnerKey, list[EvictionCandidate]] = {}
    for candidate in candidates:
        group = plan.of_pod.get((candidate.pod.namespace, candidate.pod.name))
        if group is not None:
            due.setdefault(group.owner.key, []).append(candidate)
    notes: list[str] = []
    blocked: list[Action] = []
    ready: list[tuple[float, OwnerGroup, list[EvictionCandidate]]] = []
    for key, found in due.items():
        group = plan.groups[key]
        who = f"{found[0].pod.namespace}/{found[0].pod.name}"
        why = group.blocker or group.hold
        if not why and len(found) < len(group.pods):
            why = f"{len(found)} of {len(group.pods)} GPU pods of {group.owner.label} due; waiting for all"
        if not why:
            why = _opt_out_kept(group, found, params, now)
        if not why:
            why = next(
                (f"pod {c.pod.name}: {b}" for c in found if (b := temporary_blocker(c.pod, params, now))), ""
            )
        if not why and group.disruption_blocked:
            why = group.disruption_blocked
            blocked.extend(_blocked_once(found, why, now))
        if why:
            notes.append(f"{who}: reclaim of {group.owner.label} postponed or skipped: {why}")
            continue
        ready.append((max(c.idle_since for c in found), group, found))
    ready.sort(key=lambda r: (r[0], r[1].owner.namespace, r[1].owner.label))
    cluster = cluster or Pressure((), (), ())
    served: Mapping[OwnerKey, tuple[str, ...]]
    if params.on_pressure:
        ready, served = _under_pressure(plan, ready, cluster, notes)
    else:  # every pod waiting for GPUs now may take the freed ones
        waiting = tuple(waiting_names([p for p in cluster.pending if waiting_for_gpus(p)]))
        served = {group.owner.key: waiting for _, group, _ in ready}
    hour_left = max(0, params.max_per_hour - actions_last_hour)
    per_namespace: Counter[str] = Counter()
    actions: list[Action] = []
    records: list[tuple[tuple[Action, ...], Reclamation]] = []
    taken = 0
    for idle_since, group, found in ready:
        owner = group.owner
        capped = cap_reached(
            "reclaim",
            params,
            namespace=owner.namespace,
            taken=taken,
            in_namespace=per_namespace[owner.namespace],
            hour_left=hour_left,
            last_hour=actions_last_hour,
        )
        if capped:
            notes.append(f"{owner.namespace}/{owner.label}: {capped}")
        else:
            taken += 1
            per_namespace[owner.namespace] += 1
            planned = _actions(group, found, idle_since, policy_name, params)
            actions.extend(planned)
            action = group.action.value
            freed = freed_gpus(group.pods, plan.gpu_uuids)
            ids = freed_gpu_ids(group.pods, plan.gpu_uuids)
            waiting = served.get(owner.key, ())
            record = draft(owner, action, pods=group.pods, waiting=waiting, now=now, gpus=freed, gpu_ids=ids)
            records.append((tuple(planned), record))
    return ReclaimSelection(tuple(blocked + actions), tuple(notes), tuple(records))


def pods_under_pressure(
    candidates: list[EvictionCandidate], cluster: Pressure, notes: list[str]
) -> list[EvictionCandidate]:
    """reclaimWhen OnPressure without owners read: each due pod is its own owner."""
    ordered = sorted(candidates, key=lambda c: (c.idle_since, c.pod.namespace, c.pod.name))
    offers = {(c.pod.namespace, "Pod", c.pod.name): {c.pod.node: c.pod.gpu_request} for c in ordered}
    choice = choose_for_pressure(cluster.nodes, cluster.pods, cluster.pending, offers)
    notes.extend(choice.notes)
    chosen = set(choice.chosen)
    kept = [c for c in ordered if (c.pod.namespace, "Pod", c.pod.name) in chosen]
    notes.extend(
        f"{c.pod.namespace}/{c.pod.name}: due, not evicted: reclaimWhen OnPressure and no GPU pod waiting "
        f"({len(choice.waiting)} pending for GPUs) needs its GPUs; warning kept"
        for c in ordered
        if c not in kept
    )
    return kept


def _under_pressure(
    plan: OwnerPlan,
    ready: list[tuple[float, OwnerGroup, list[EvictionCandidate]]],
    pressure: Pressure,
    notes: list[str],
) -> tuple[list[tuple[float, OwnerGroup, list[EvictionCandidate]]], Mapping[OwnerKey, tuple[str, ...]]]:
    """The ready owners that make waiting GPU pods fit (the rest keep their warnings and wait)."""
    # Freeing: pods of owners our own status proves we reclaimed (group.reclaimed), and only those
    # actually terminating. A forged `reclaimed` annotation, or a pod pointed at an owner we really
    # scaled to zero but that nothing deletes, frees nothing.
    freeing = frozenset(p.uid for g in plan.groups.values() if g.reclaimed for p in g.pods if p.deleting)
    choice = choose_for_pressure(
        pressure.nodes,
        pressure.pods,
        pressure.pending,
        {group.owner.key: _gpus_by_node(group.pods) for _, group, _ in ready},
        freeing,
    )
    notes.extend(choice.notes)
    keep = set(choice.chosen)
    for _, group, _ in ready:
        if group.owner.key not in keep:
            notes.append(
                f"{group.owner.namespace}/{group.owner.label}: due, not reclaimed: reclaimWhen OnPressure and "
                f"no GPU pod waiting ({len(choice.waiting)} pending for GPUs) needs its GPUs; warning kept"
            )
    return [r for r in ready if r[1].owner.key in keep], choice.served


def _opt_out_until(found: Sequence[EvictionCandidate], params: CycleParams) -> float | None:
    """When an owner we cannot act on stops being honoured as an opt-out: ``maxKeep`` after its
    pods' warnings ran out (their evict-after, kept in the cluster). None: not honoured at all
    (allowOptOut false, or allowBarePods: pods nothing recreates may be evicted)."""
    if not params.allow_opt_out or params.allow_bare_pods:
        return None
    due = [parse_rfc3339(c.pod.annotations.get(names.EVICT_AFTER)) for c in found]
    return max((d for d in due if d is not None), default=0.0) + params.max_keep_s


def _opt_out_kept(
    group: OwnerGroup, found: Sequence[EvictionCandidate], params: CycleParams, now: float
) -> str:
    if not group.fallback:
        return ""
    until = _opt_out_until(found, params)
    if until is None or now >= until:
        return ""
    return (
        f"{group.why}: honoured as an opt-out (idle.allowOptOut) until {format_rfc3339(until)} "
        f"(maxKeep {format_duration(params.max_keep_s)}), then its pods are evicted"
    )


def _fallback_reason(group: OwnerGroup, params: CycleParams) -> str:
    """Why the pods of an owner we cannot act on are evicted (the GPUIdleEvicted event)."""
    if not params.allow_opt_out:
        kept = "idle.allowOptOut is false"
    elif params.allow_bare_pods:
        kept = "eviction.allowBarePods is true"
    else:
        kept = f"honoured as an opt-out for maxKeep {format_duration(params.max_keep_s)}, which is over"
    return f"{group.why}; nothing we know would recreate its pods, so they are evicted ({kept})"


def _blocked_once(found: list[EvictionCandidate], why: str, now: float) -> list[Action]:
    """The refusal recorded on each pod the first time (``eviction-blocked`` + EvictionBlocked), as
    a refused eviction is: the owner is retried every cycle, the event is not repeated."""
    out: list[Action] = []
    for c in found:
        pod = c.pod
        if names.EVICTION_BLOCKED not in pod.annotations:
            out.append(
                AnnotatePod(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    annotations={names.EVICTION_BLOCKED: format_rfc3339(now)},
                )
            )
            out.append(
                PodEvent(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    reason=names.EV_EVICTION_BLOCKED,
                    message=why,
                    type="Warning",
                )
            )
    return out


def _actions(
    group: OwnerGroup,
    found: list[EvictionCandidate],
    idle_since: float,
    policy_name: str,
    params: CycleParams,
) -> list[Action]:
    if group.action is ReclaimAction.EVICT:
        why = f"; {_fallback_reason(group, params)}" if group.fallback else ""
        return [
            EvictPod(
                namespace=c.pod.namespace,
                name=c.pod.name,
                uid=c.pod.uid,
                reason=f"{c.message}{why} (policy {policy_name})",
            )
            for c in sorted(found, key=lambda c: c.pod.name)
        ]
    owner = group.owner
    pods = tuple(sorted((c.pod.name, c.pod.uid) for c in found))
    reason = (
        f"all {len(pods)} GPU pod(s) of {owner.label} idle since {format_rfc3339(idle_since)} and warned; "
        f"{action_words(owner, group.action).split(' will be ', 1)[-1]} to free the GPU by policy {policy_name}"
    )
    admitted = kueue_admitted(owner)
    if admitted is not None:
        reason += f" (the Kueue Workload of {admitted.kind.lower()}/{admitted.name})"
    if owner.scheduler is not None:
        reason += f"; {scheduler_note(owner)}"
    if group.autoscaler:
        reason += (
            f"; horizontalpodautoscaler/{group.autoscaler} stops scaling it at 0 replicas (ScalingDisabled) "
            "and takes over again once it is restored"
        )
    return [
        ReclaimOwner(
            namespace=owner.namespace,
            owner=owner.ref,
            action=group.action.value,
            pods=pods,
            reason=reason,
            policy=policy_name,
            admitted=admitted,
            autoscaler=group.autoscaler,
        )
    ]
