"""The policy's status after a cycle, and the conditions and policy events that go with it.

Counts (verdicts, idle GPUs, waste, reclaimed GPU-hours) and the conditions MetricsAvailable, Ready,
PolicyValid, Shadowed and CircuitBreakerOpen, each stamped with the generation the cycle read. An
event goes out when a condition changes, never once per cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_efficiency.api import names
from gpu_efficiency.api.status import (
    Condition,
    GPUEfficiencyPolicyStatus,
    PendingGpuDemand,
    QuarantinedNode,
    VerdictCounts,
)
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.conditions import condition_flipped, find_condition, flip_condition, set_condition
from gpu_efficiency.engine.exporter_coverage import NO_NODE_LABELS, coverage, nodeless, signals_condition
from gpu_efficiency.engine.model import (
    FaultOutcome,
    GPUSample,
    PodVerdict,
    PodView,
    PolicyEvent,
    Snapshot,
    Verdict,
)
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.budgets import recent_within_hour
from gpu_efficiency.engine.reclaim.idle import PodKey
from gpu_efficiency.engine.reclaim.judge import JudgeContext
from gpu_efficiency.engine.reclaim.pressure import waiting_for_gpus
from gpu_efficiency.engine.reclaim.reclaimproof import advance
from gpu_efficiency.engine.reclaim.waste import elapsed_hours, idle_waste


def policy_status(
    snapshot: Snapshot,
    params: CycleParams,
    *,
    verdicts: Sequence[PodVerdict],
    gpus_evaluated: int,
    warned: int,
    idle_gpu_models: Sequence[tuple[str, str]],
    faults: FaultOutcome | None,
    shadowed: Mapping[str, int],
    unattributed: str = "",
    dropped: Mapping[str, int] | None = None,
) -> tuple[GPUEfficiencyPolicyStatus, list[PolicyEvent]]:
    """The new status and the policy events its condition flips call for.

    ``shadowed``: pods this policy selects that older policies judge, counted by policy.
    ``unattributed`` (see ``unattributed``) makes MetricsAvailable False although the source answered.
    The spec parsed (an invalid one never reaches the planner), so PolicyValid is True; every
    condition, carried or set, is stamped with the generation this cycle read.
    """
    previous = snapshot.status
    now, generation = snapshot.now, snapshot.generation
    tally = {Verdict.IDLE: 0, Verdict.UNDERUTILIZED: 0, Verdict.EFFICIENT: 0, Verdict.UNKNOWN: 0}
    for v in verdicts:
        tally[v.verdict] += 1
    counts = VerdictCounts(
        idle=tally[Verdict.IDLE],
        underutilized=tally[Verdict.UNDERUTILIZED],
        efficient=tally[Verdict.EFFICIENT],
        unknown=tally[Verdict.UNKNOWN],
    )
    events: list[PolicyEvent] = []
    conditions = list(previous.conditions)
    cover = coverage(snapshot.gpus)
    no_node = nodeless(cover)  # no GPU tied to a node: no pod can be either
    unattributed = no_node or unattributed
    if snapshot.metrics_available and unattributed:
        conditions, event = flip_condition(
            conditions,
            type=names.COND_METRICS,
            status="False",
            reason=NO_NODE_LABELS if no_node else "NoPodSamples",
            message=unattributed,
            now=now,
            generation=generation,
            event=PolicyEvent(
                reason=names.EV_METRICS_UNAVAILABLE,
                message=f"{unattributed}: the pods stay Unknown and are never evicted",
                type="Warning",
            ),
        )
        events.extend([event] if event is not None else [])
        conditions = set_condition(
            conditions,
            type=names.COND_READY,
            status="True",
            reason="Evaluated",
            message=f"{len(verdicts)} pods and {gpus_evaluated} GPUs evaluated",
            now=now,
            generation=generation,
        )
    elif snapshot.metrics_available:
        untrusted = ", ".join(f"{reason} {count}" for reason, count in (dropped or {}).items())
        conditions = set_condition(
            conditions,
            type=names.COND_METRICS,
            status="True",
            reason="MetricsRead",
            message=f"samples for {len(snapshot.gpus)} GPUs"
            + (f"; dropped as untrustworthy: {untrusted}" if untrusted else ""),
            now=now,
            generation=generation,
        )
        conditions = set_condition(
            conditions,
            type=names.COND_READY,
            status="True",
            reason="Evaluated",
            message=f"{len(verdicts)} pods and {gpus_evaluated} GPUs evaluated",
            now=now,
            generation=generation,
        )
    else:
        message = snapshot.metrics_error or "the metrics source failed"
        conditions, event = flip_condition(
            conditions,
            type=names.COND_METRICS,
            status="False",
            reason="SourceUnavailable",
            message=message,
            now=now,
            generation=generation,
            event=PolicyEvent(
                reason=names.EV_METRICS_UNAVAILABLE,
                message=f"{message}: no pod is judged or evicted",
                type="Warning",
            ),
        )
        events.extend([event] if event is not None else [])
        conditions = set_condition(
            conditions,
            type=names.COND_READY,
            status="False",
            reason="MetricsUnavailable",
            message="metrics unavailable: verdicts Unknown, nothing evicted",
            now=now,
            generation=generation,
        )
    conditions = set_condition(
        conditions,
        type=names.COND_VALID,
        status="True",
        reason="Valid",
        message="the spec is valid",
        now=now,
        generation=generation,
    )
    conditions, shadow_events = _shadowed_condition(conditions, shadowed, now, generation)
    events.extend(shadow_events)
    if snapshot.metrics_available:
        conditions, signal_events = signals_condition(conditions, cover, now, generation)
        events.extend(signal_events)
    quarantined = previous.quarantined_nodes
    if faults is not None:
        state = "True" if faults.breaker_open else "False"
        if (
            faults.breaker_open
            and condition_flipped(conditions, names.COND_BREAKER, "True")
            and not any(isinstance(a, PolicyEvent) and a.reason == names.EV_BREAKER for a in faults.actions)
        ):
            events.append(
                PolicyEvent(
                    reason=names.EV_BREAKER,
                    message=faults.breaker_message or "circuit breaker open",
                    type="Warning",
                )
            )
        conditions = set_condition(
            conditions,
            type=names.COND_BREAKER,
            status=state,
            reason="TooManyFaultyNodes" if faults.breaker_open else "Closed",
            message=faults.breaker_message,
            now=now,
            generation=generation,
        )
        quarantined = [
            QuarantinedNode(node=q.node, kind=q.kind, gpus=list(q.gpus), tainted=q.tainted, since=q.since)
            for q in faults.quarantined
        ]
    hours = elapsed_hours(previous.last_evaluation_time, now, params.interval_s)
    waste = idle_waste(idle_gpu_models, params.prices, hours)
    waiting = [p for p in snapshot.pending if waiting_for_gpus(p)]
    # owners that could not be read are not owners gone: their records (restore's proof) stay in force
    owners = None if snapshot.owners_error else snapshot.owners
    reclamations, returned = advance(previous.reclamations, snapshot.pods, owners, now, hours)
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "conditions": [c.model_copy(update={"observed_generation": generation}) for c in conditions],
            "last_evaluation_time": format_rfc3339(now),
            "gpus_evaluated": gpus_evaluated,
            "pods_evaluated": len(verdicts),
            "verdicts": counts,
            "idle_gpus": waste.idle_gpus,
            "warned_pods": warned,
            "recent_evictions": recent_within_hour(previous.recent_evictions, now),
            "idle_gpu_hours": previous.idle_gpu_hours + waste.idle_gpu_hours,
            "estimated_waste_per_hour": waste.per_hour,
            "estimated_waste_total": previous.estimated_waste_total + waste.cost,
            "quarantined_nodes": quarantined,
            "dropped_samples": dict(dropped or {}),
            "exporter_generations": dict(cover.generations)
            if snapshot.metrics_available
            else previous.exporter_generations,
            "blind_gpus": dict(cover.blind) if snapshot.metrics_available else previous.blind_gpus,
            "pending_gpu_demand": PendingGpuDemand(
                pods=len(waiting), gpus=sum(p.gpu_request for p in waiting)
            ),
            "reclamations": reclamations,
            "gpu_hours_returned": previous.gpu_hours_returned + returned,
        }
    )
    return status, events


def unattributed(
    in_scope: Sequence[PodView], pod_gpus: Mapping[PodKey, list[GPUSample]], gpus: int, ctx: JudgeContext
) -> str:
    """Why no pod can be judged although GPUs have samples ('' when some can): the exporter's
    series carry no pod labels (or not those of the pods in scope), so every warmed-up pod is
    Unknown. A missing-metrics condition, like Prometheus down, rather than a silent Unknown."""
    if not gpus:
        return ""
    grown = [
        pod
        for pod in in_scope
        if pod.start_time is not None and ctx.now - pod.start_time >= ctx.params.min_pod_age_s
    ]
    if not grown or any((pod.namespace, pod.name) in pod_gpus for pod in grown):
        return ""
    return (
        f"{gpus} GPUs have samples but none is attributed to the {len(grown)} pod(s) in scope "
        "(check the exporter's pod labels: pod/namespace, exported_pod/exported_namespace or pod_name/pod_namespace)"
    )


def _shadowed_condition(
    conditions: list[Condition], shadowed: Mapping[str, int], now: float, generation: int
) -> tuple[list[Condition], list[PolicyEvent]]:
    """The Shadowed condition: which older policies judge pods this policy selects, and how many.

    A Warning event goes out when the set of winning policies changes (not on every pod count
    change, which churns with the workload), so an admin learns once why this policy acts on less.
    """
    if not shadowed:
        return set_condition(
            conditions,
            type=names.COND_SHADOWED,
            status="False",
            reason="NoOverlap",
            message="no older policy selects this policy's pods",
            now=now,
            generation=generation,
        ), []
    winners = ", ".join(
        f"{name} ({count} pod{'' if count == 1 else 's'})" for name, count in sorted(shadowed.items())
    )
    total = sum(shadowed.values())
    message = (
        f"{total} GPU pods this policy selects are judged by older policies, which take precedence: "
        f"{winners}; narrow the selections so they do not overlap"
    )
    previous = find_condition(conditions, names.COND_SHADOWED)
    previous_winners = previous.message.split(": ", 1)[-1] if previous and previous.status == "True" else ""
    events: list[PolicyEvent] = []
    if previous is None or previous.status != "True" or _names_in(previous_winners) != sorted(shadowed):
        events.append(PolicyEvent(reason=names.EV_POLICY_SHADOWED, message=message, type="Warning"))
    updated = set_condition(
        conditions,
        type=names.COND_SHADOWED,
        status="True",
        reason="OlderPolicyOverlaps",
        message=message,
        now=now,
        generation=generation,
    )
    return updated, events


def _names_in(winners: str) -> list[str]:
    """The policy names in a Shadowed message's list ("a (3 pods), b (1 pod); ..."): policy names
    are DNS subdomains, so they hold no comma, semicolon or space."""
    listed = winners.split(";", 1)[0]
    return sorted(part.strip().split(" (", 1)[0] for part in listed.split(",") if part.strip())
