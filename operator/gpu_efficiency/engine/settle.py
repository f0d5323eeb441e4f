"""Settle a cycle: what the writes really did, folded into the policy's status, the notifications
to offer, the events to emit and the gauges to export. Pure, so the runtime only delivers.

The plan says what was attempted; only outcomes count (safety: status is honest). Settling happens
in two steps around the notification hand-off, because the sinks' health is read after this
cycle's notifications were offered to them: ``settle`` folds the outcomes and drafts the
notifications, ``Settlement.close`` adds the conditions that depend on what the runtime saw
(the sinks' failures, status fields it could not read) and their events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_efficiency.api import names
from gpu_efficiency.api.status import Condition, GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.conditions import find_condition, set_condition
from gpu_efficiency.engine.model import Action, DrainPod, EvictPod, Plan, PolicyEvent, ReclaimOwner, Snapshot
from gpu_efficiency.engine.notify.messages import (
    Notification,
    notifications,
    notifications_condition,
    pending_evictions,
)
from gpu_efficiency.engine.notify.routes import route_problems, slack_routes
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.engine.quarantine.kinds import FaultKind
from gpu_efficiency.engine.reclaim.reclaimproof import accepted, newly_running

#: The most of a status-read problem a condition message and its event carry.
MESSAGE_MAX = 1024


@dataclass(frozen=True, slots=True)
class Gauges:
    """The cycle's numbers for the metrics endpoint: per-cycle gauges follow the last cycle, the
    ``*_added`` values are what this cycle adds to a counter, the outcome tallies count writes."""

    cycle_result: str  # ok | metrics_unavailable
    metrics_available: bool
    verdicts: Mapping[str, int]
    diagnoses: Mapping[str, int]
    idle_gpus: int
    idle_gpu_hours_added: float
    dropped_samples: Mapping[str, int]
    waste_per_hour: float
    breaker_open: bool
    #: fault kind -> nodes tainted for it; every kind present, at 0 when none.
    tainted_nodes: Mapping[str, int]
    stragglers: Mapping[tuple[str, str], int]
    pending_evictions: Mapping[tuple[str, ...], float]
    gpu_hours_returned_added: float
    reclaim_to_running_s: tuple[float, ...]
    pending_gpu_demand: float
    evictions: Mapping[str, int]  # result -> count
    drain_evictions: Mapping[str, int]  # result -> count
    reclaims: Mapping[tuple[str, str], int]  # (action, result) -> count


@dataclass(frozen=True, slots=True)
class Settlement:
    status: GPUEfficiencyPolicyStatus
    notifications: tuple[Notification, ...] = ()
    events: tuple[PolicyEvent, ...] = ()
    gauges: Gauges | None = None
    now: float = 0.0
    generation: int = 0
    #: namespace -> why its own Slack webhook annotation is ignored (the annotation's own fault).
    misrouted: Mapping[str, str] = field(default_factory=dict)

    def close(
        self,
        *,
        sink_failures: Mapping[str, str] | None,
        sinks: int,
        unreadable: Sequence[str] = (),
        misrouted: Mapping[str, str] | None = None,
    ) -> Settlement:
        """Add NotificationsHealthy (``sink_failures`` None: the hand-off failed, leave it as it
        was; ``misrouted``: namespaces whose webhook the sinks could not use at their last post)
        and StatusValid (``unreadable``: status fields a read from the server dropped)."""
        conditions, events = list(self.status.conditions), list(self.events)
        if sink_failures is not None:
            routes = dict(self.misrouted)
            for namespace, why in (misrouted or {}).items():
                routes[namespace] = f"{routes[namespace]}; {why}" if namespace in routes else why
            conditions, event = notifications_condition(
                conditions,
                sink_failures,
                sinks=sinks,
                now=self.now,
                generation=self.generation,
                misrouted=routes,
            )
            events.extend([event] if event is not None else [])
        conditions, event = _status_valid(conditions, unreadable, self.now, self.generation)
        events.extend([event] if event is not None else [])
        if conditions == list(self.status.conditions):
            return replace(self, events=tuple(events))
        status = self.status.model_copy(update={"conditions": conditions})
        return replace(self, status=status, events=tuple(events))


def settle(snapshot: Snapshot, plan: Plan, outcomes: Sequence[Outcome], *, notify: bool) -> Settlement:
    """Fold the outcomes into the planned status, draft the notifications (``notify``: the policy
    has sinks and this process delivers) and count the gauges."""
    status = fold_outcomes(plan.status, outcomes, snapshot.now, plan.reclamations)
    return Settlement(
        status=status,
        notifications=tuple(_notifications(snapshot, plan, outcomes)) if notify else (),
        misrouted=_misrouted(snapshot, plan) if notify else {},
        gauges=_gauges(snapshot, plan, outcomes, status),
        now=snapshot.now,
        generation=snapshot.generation,
    )


def settle_invalid(
    previous: GPUEfficiencyPolicyStatus, *, message: str, now: float, generation: int
) -> Settlement:
    """An invalid spec: Valid and Ready False, and a PolicyInvalid event once per message; nothing
    else changes (the policy judges nothing until fixed)."""
    was_invalid = any(
        c.type == names.COND_VALID and c.status == "False" and c.message == message
        for c in previous.conditions
    )
    conditions = set_condition(
        previous.conditions,
        type=names.COND_VALID,
        status="False",
        reason="InvalidSpec",
        message=message,
        now=now,
        generation=generation,
    )
    conditions = set_condition(
        conditions,
        type=names.COND_READY,
        status="False",
        reason="InvalidSpec",
        message="the policy spec is invalid",
        now=now,
        generation=generation,
    )
    status = previous.model_copy(update={"conditions": conditions, "observed_generation": generation})
    event = PolicyEvent(reason=names.EV_POLICY_INVALID, message=message, type="Warning")
    return Settlement(status=status, events=() if was_invalid else (event,), now=now, generation=generation)


def fold_outcomes(
    status: GPUEfficiencyPolicyStatus,
    outcomes: Sequence[Outcome],
    now: float,
    drafts: Sequence[tuple[tuple[Action, ...], Reclamation]] = (),
) -> GPUEfficiencyPolicyStatus:
    """Count what actually happened (the plan only says what was attempted); ``drafts``: the
    plan's reclamation records, kept for the reclamations one of whose actions was accepted."""
    # An outcome the API left unknown (5xx or timeout after sending, re-read inconclusive) counts as
    # done for the hour's budget and keeps its reclamation record (restore needs it).
    evicted = [o for o in outcomes if isinstance(o.action, EvictPod) and o.result.counts]
    blocked = [o for o in outcomes if isinstance(o.action, EvictPod) and o.result is Result.BLOCKED]
    reclaimed = [o for o in outcomes if isinstance(o.action, ReclaimOwner) and o.result.counts]
    if not evicted and not blocked and not reclaimed:
        return status
    done = [o.action for o in (*evicted, *reclaimed)]
    records = [record for actions, record in drafts if any(a in done for a in actions)]
    if records:
        status = status.model_copy(update={"reclamations": accepted(status.reclamations, records)})
    # each owner reclaimed counts once against the rolling hour's budget, like one eviction
    recent = [*status.recent_evictions, *(format_rfc3339(now) for _ in [*evicted, *reclaimed])]
    return status.model_copy(
        update={
            "evictions_total": status.evictions_total + len(evicted),
            "evictions_blocked_total": status.evictions_blocked_total + len(blocked),
            "reclaims_total": status.reclaims_total + len(reclaimed),
            "recent_evictions": recent,
        }
    )


def _notifications(snapshot: Snapshot, plan: Plan, outcomes: Sequence[Outcome]) -> list[Notification]:
    """What this cycle did, for the sinks: the accepted actions and the evictions refused for the
    first time (a pod already warned as blocked was announced before)."""
    spec = snapshot.policy
    if not spec.notify:
        return []
    warned_before = {p.uid for p in snapshot.pods if names.EVICTION_BLOCKED in p.annotations}
    done = [o.action for o in outcomes if o.result is Result.DONE]
    refused = [
        o.action
        for o in outcomes
        if isinstance(o.action, EvictPod) and o.result is Result.BLOCKED and o.action.uid not in warned_before
    ]
    return notifications(
        done,
        refused,
        snapshot,
        plan,
        window_s=spec.window.seconds,
        max_keep_s=spec.idle.max_keep.seconds,
        keep_allowed=spec.idle.allow_keep_until,
    )


def _misrouted(snapshot: Snapshot, plan: Plan) -> dict[str, str]:
    """Namespaces this policy judged whose Slack webhook annotation cannot name a Secret key."""
    return route_problems(
        slack_routes(snapshot.namespaces), snapshot.policy.notify, (v.namespace for v in plan.verdicts)
    )


def _status_valid(
    conditions: list[Condition], unreadable: Sequence[str], now: float, generation: int
) -> tuple[list[Condition], PolicyEvent | None]:
    """StatusValid False (and a StatusFieldInvalid event) in the cycle after a read of the status
    dropped unreadable fields; the other fields were kept and this cycle rewrites the status without
    them, so the next cycle sets it True again (absent until a read first drops something)."""
    if not unreadable:
        previous = find_condition(conditions, names.COND_STATUS_VALID)
        if previous is None or previous.status == "True":
            return conditions, None
        readable = set_condition(
            conditions,
            type=names.COND_STATUS_VALID,
            status="True",
            reason="Readable",
            message="every status field was readable",
            now=now,
            generation=generation,
        )
        return readable, None
    message = (
        f"dropped as unreadable, every other status field kept (recentEvictions, reclamations): "
        f"{'; '.join(unreadable)}"
    )[:MESSAGE_MAX]
    event = PolicyEvent(reason=names.EV_STATUS_FIELD_INVALID, message=message, type="Warning")
    updated = set_condition(
        conditions,
        type=names.COND_STATUS_VALID,
        status="False",
        reason="FieldsUnreadable",
        message=message,
        now=now,
        generation=generation,
    )
    return updated, event


def _gauges(
    snapshot: Snapshot, plan: Plan, outcomes: Sequence[Outcome], status: GPUEfficiencyPolicyStatus
) -> Gauges:
    counts = status.verdicts
    tainted = {kind.value: 0 for kind in FaultKind}
    for q in status.quarantined_nodes:
        if q.tainted:
            tainted[q.kind] = tainted.get(q.kind, 0) + 1
    evictions: Counter[str] = Counter()
    drains: Counter[str] = Counter()
    reclaims: Counter[tuple[str, str]] = Counter()
    for o in outcomes:
        if isinstance(o.action, EvictPod):
            evictions[o.result.value] += 1
        elif isinstance(o.action, DrainPod):
            drains[o.result.value] += 1
        elif isinstance(o.action, ReclaimOwner):
            reclaims[(o.action.action, o.result.value)] += 1
    return Gauges(
        cycle_result="ok" if snapshot.metrics_available else "metrics_unavailable",
        metrics_available=snapshot.metrics_available,
        verdicts={
            "Idle": counts.idle,
            "Underutilized": counts.underutilized,
            "Efficient": counts.efficient,
            "Unknown": counts.unknown,
        },
        diagnoses=Counter(v.diagnosis.value for v in plan.verdicts),
        idle_gpus=status.idle_gpus,
        idle_gpu_hours_added=max(0.0, status.idle_gpu_hours - snapshot.status.idle_gpu_hours),
        dropped_samples=plan.status.dropped_samples,
        waste_per_hour=status.estimated_waste_per_hour,
        breaker_open=any(c.type == names.COND_BREAKER and c.status == "True" for c in status.conditions),
        tainted_nodes=tainted,
        stragglers={(ns, group): n for ns, group, n in plan.stragglers},
        pending_evictions=pending_evictions(snapshot, plan),
        gpu_hours_returned_added=max(0.0, status.gpu_hours_returned - snapshot.status.gpu_hours_returned),
        reclaim_to_running_s=tuple(newly_running(snapshot.status.reclamations, status.reclamations)),
        pending_gpu_demand=status.pending_gpu_demand.gpus,
        evictions=evictions,
        drain_evictions=drains,
        reclaims=reclaims,
    )
