"""One evaluation cycle: snapshot in, plan out (verdicts, pod actions, evictions, faults, status).

Order of the plan's actions: per pod its annotation patch then its events; then fault actions and
policy events; evictions last, so every warning and annotation is written before anything
destructive happens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.status import (
    Condition,
    GPUEfficiencyPolicyStatus,
    PendingGpuDemand,
    QuarantinedNode,
    Reclamation,
    VerdictCounts,
)
from gpu_efficiency.engine.conditions import condition_flipped, find_condition, set_condition
from gpu_efficiency.engine.evaluation import Evaluation, PodRecord
from gpu_efficiency.engine.explain import explain_lines
from gpu_efficiency.engine.faults.evaluate import evaluate_faults
from gpu_efficiency.engine.faults.kinds import FaultKind
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    Diagnosis,
    EvictPod,
    FaultOutcome,
    GPUSample,
    Plan,
    PodEvent,
    PodVerdict,
    PodView,
    PolicyEvent,
    Signal,
    Snapshot,
    Stats,
    TaintDevices,
    TaintNode,
    Verdict,
    Window,
)
from gpu_efficiency.engine.params import CycleParams, cycle_params
from gpu_efficiency.engine.pods.acknowledge import ending_with, keep_command
from gpu_efficiency.engine.pods.activity import (
    ACTIVITY_CHAIN,
    DataBounds,
    GPUActivity,
    carried_bounds,
    gpu_activity,
    gpu_util_fraction,
)
from gpu_efficiency.engine.pods.annotations import (
    annotation_patch,
    cleanup_patch,
    desired_annotations,
    state_value,
)
from gpu_efficiency.engine.pods.budgets import (
    EvictionCandidate,
    permanent_blocker,
    recent_within_hour,
    select_evictions,
)
from gpu_efficiency.engine.pods.idle import (
    GPUState,
    PodKey,
    below_idle_threshold,
    gpu_state,
    idle_lifecycle,
    idle_rule,
    is_shared,
    shared_idleness,
)
from gpu_efficiency.engine.pods.idleledger import IdleClock, IdleLedger
from gpu_efficiency.engine.pods.judgememo import JudgeInputs, JudgeMemo, Judgement
from gpu_efficiency.engine.pods.owners import action_words
from gpu_efficiency.engine.pods.pressure import choose_for_pressure, waiting_for_gpus
from gpu_efficiency.engine.pods.reclaim import OwnerGroup, OwnerPlan, Pressure, group_owners, select_reclaims
from gpu_efficiency.engine.pods.reclaimproof import advance
from gpu_efficiency.engine.pods.underutilization import RECOMMENDATIONS, diagnose, verdict_of
from gpu_efficiency.engine.pods.waste import elapsed_hours, idle_waste
from gpu_efficiency.engine.selection import Scope, build_scope
from gpu_efficiency.engine.stragglers import evaluate_stragglers, straggler_judgements, straggler_params
from gpu_efficiency.engine.timefmt import format_rfc3339
from gpu_efficiency.engine.trust import merged_counts, vet_samples

_SIGNAL_RANK: Mapping[Signal, int] = {signal: i for i, (signal, _, _) in enumerate(ACTIVITY_CHAIN)}
#: Plain-string values of the enums, looked up instead of the slower ``.value`` descriptor.
_VALUE: Mapping[Signal | Diagnosis | Verdict, str] = {
    member: member.value for enum in (Signal, Diagnosis, Verdict) for member in enum
}
_EMPTY: Mapping[Signal, Stats] = {}


class _Context:
    """Per-cycle caches: activity per GPU, data bounds per expected sample count."""

    __slots__ = ("_activity", "_bounds", "idle_rule", "memo", "now", "params", "pod_gpus")

    def __init__(
        self,
        params: CycleParams,
        now: float,
        pod_gpus: Mapping[PodKey, list[GPUSample]],
        memo: JudgeMemo | None = None,
    ) -> None:
        self.params = params
        self.now = now
        self.pod_gpus = pod_gpus
        self.memo = memo
        self.idle_rule = idle_rule(params)
        self._activity: dict[str, GPUActivity] = {}
        self._bounds: dict[tuple[float, bool | None], DataBounds] = {}

    def bounds(self, sample: GPUSample) -> DataBounds:
        expected = sample.expected_samples.get(Window.ACTIVITY) or self.params.expected_activity_samples
        oldest = self.now - self.params.max_staleness_s
        newest = sample.carried_newest
        key = (expected, None if newest is None else newest >= oldest)  # a carried window: fresh or not
        found = self._bounds.get(key)
        if found is None:
            found = carried_bounds(
                DataBounds(needed=expected * self.params.min_coverage, oldest=oldest), newest
            )
            self._bounds[key] = found
        return found

    def activity(self, sample: GPUSample, bounds: DataBounds | None = None) -> GPUActivity:
        found = self._activity.get(sample.uuid)
        if found is None:
            found = gpu_activity(sample, bounds or self.bounds(sample))
            self._activity[sample.uuid] = found
        return found

    def gpu_state(self, sample: GPUSample) -> str:
        return gpu_state(self.activity(sample), self.params)


def _index_pods(gpus: Sequence[GPUSample]) -> dict[PodKey, list[GPUSample]]:
    """GPU samples of each pod, from the exporter's pod labels (a GPU listed once per pod)."""
    pod_gpus: dict[PodKey, list[GPUSample]] = {}
    for sample in gpus:
        for ref in sample.pods:
            key = (ref.namespace, ref.name)
            samples = pod_gpus.get(key)
            if samples is None:
                pod_gpus[key] = [sample]
            elif samples[-1] is not sample:
                samples.append(sample)
    return pod_gpus


def _unknown(pod: PodView, reason: str, uuids: tuple[str, ...] = (), recommendation: str = "") -> PodVerdict:
    return PodVerdict(
        namespace=pod.namespace,
        name=pod.name,
        verdict=Verdict.UNKNOWN,
        diagnosis=Diagnosis.INSUFFICIENT_DATA,
        recommendation=recommendation or RECOMMENDATIONS[Diagnosis.INSUFFICIENT_DATA],
        activity_signal=None,
        activity_peak=None,
        activity_avg=None,
        gpu_util_avg=None,
        efficiency=None,
        gpus=uuids,
        reason=reason,
    )


def _warming_up(pod: PodView, min_age_s: float) -> PodVerdict:
    """Unknown for a pod younger than minPodAge, saying so and until when (nothing is wrong yet)."""
    if pod.start_time is None:
        text = "not started yet: judged once it has run " + format_duration(min_age_s)
    else:
        text = (
            f"warming up: judged from {format_rfc3339(pod.start_time + min_age_s)}, once it has run "
            f"{format_duration(min_age_s)} (until then the window may hold the GPU's previous tenant)"
        )
    return _unknown(pod, text, recommendation=text)


def _judge(pod: PodView, key: PodKey, ctx: _Context) -> PodRecord:
    """The pod's verdict: Unknown if a GPU lacks data, Idle if all are idle (sharing rule), else diagnosis."""
    params = ctx.params
    if pod.start_time is None or ctx.now - pod.start_time < params.min_pod_age_s:
        # Warm-up (minPodAge, default the window): the window's samples are per GPU and may still be
        # the previous tenant's, so a young pod gets no verdict and no idle clock yet.
        return PodRecord(pod, _warming_up(pod, params.min_pod_age_s))
    samples = ctx.pod_gpus.get(key)
    if not samples:
        return PodRecord(
            pod,
            _unknown(pod, "no DCGM samples are attributed to this pod (check the exporter's pod labels)"),
        )
    bounds = [ctx.bounds(s) for s in samples]
    memo = ctx.memo
    if memo is None or is_shared(samples, key) or any(s.carried_newest is None for s in samples):
        return _judge_gpus(pod, key, ctx, samples, bounds)  # only carried windows are kept by the memo
    inputs: JudgeInputs = tuple(
        [
            (s.uuid, s.stats.get(Window.ACTIVITY) or _EMPTY, b, s.fb_total_mib)
            for s, b in zip(samples, bounds, strict=True)
        ]
    )
    kept = memo.get(key, inputs)
    if kept is not None:
        return PodRecord(pod, kept.verdict, kept.activities, kept.findings)
    record = _judge_gpus(pod, key, ctx, samples, bounds)
    memo.put(key, inputs, Judgement(record.verdict, record.activities, record.findings))
    return record


def _judge_gpus(
    pod: PodView, key: PodKey, ctx: _Context, samples: Sequence[GPUSample], bounds: Sequence[DataBounds]
) -> PodRecord:
    """``_judge`` past the warm-up: the verdict from the pod's GPUs' activity windows."""
    params = ctx.params
    activities = tuple([ctx.activity(s, b) for s, b in zip(samples, bounds, strict=True)])
    uuids = tuple([a.uuid for a in activities])
    for activity in activities:
        if activity.signal is None:
            return PodRecord(
                pod, _unknown(pod, f"GPU {activity.uuid}: {activity.unknown_reason}", uuids), activities
            )
    windows = [s.stats.get(Window.ACTIVITY) or _EMPTY for s in samples]
    if len(activities) == 1:
        only = activities[0]
        peak, avg, signal = only.peak, only.avg, only.signal
        util = gpu_util_fraction(windows[0], bounds[0])
    else:
        peak = max([a.peak for a in activities])
        avg = sum([a.avg for a in activities]) / len(activities)
        signal = max([a.signal for a in activities if a.signal is not None], key=_SIGNAL_RANK.__getitem__)
        utils = [gpu_util_fraction(w, b) for w, b in zip(windows, bounds, strict=True)]
        known_utils = [u for u in utils if u is not None]
        util = sum(known_utils) / len(known_utils) if known_utils else None
    if signal is None:  # unreachable: every activity is known here; keeps the type checker exact
        return PodRecord(pod, _unknown(pod, "no activity signal", uuids), activities)
    efficiency = None
    if util is not None and util >= 0.01 and signal is not Signal.GPU_UTIL:
        efficiency = min(100.0, avg / util * 100.0)

    sharing = ""
    if params.idle_enabled and below_idle_threshold(peak, params):
        idle_evidence = f"peak {_VALUE[signal]} {peak:.3f}{ctx.idle_rule}"
        state = GPUState.IDLE
        if is_shared(samples, key):
            shared = shared_idleness(key, ctx.pod_gpus, ctx.gpu_state)
            state = shared.state
            sharing = (
                f"own GPUs idle but {shared.why}" if shared.why else "shared GPUs: every pod on them is idle"
            )
            if state == GPUState.UNKNOWN:
                return PodRecord(pod, _unknown(pod, sharing, uuids), activities, (), sharing)
        if state == GPUState.IDLE:
            verdict = PodVerdict(
                namespace=pod.namespace, name=pod.name, verdict=Verdict.IDLE, diagnosis=Diagnosis.IDLE, recommendation=RECOMMENDATIONS[Diagnosis.IDLE],
                activity_signal=signal, activity_peak=peak, activity_avg=avg, gpu_util_avg=util, efficiency=efficiency, gpus=uuids, reason=idle_evidence,
            )  # fmt: skip
            return PodRecord(pod, verdict, activities, (), sharing)

    if not params.under_enabled:
        good = avg >= params.under.efficient_sm_active_above
        verdict = PodVerdict(
            namespace=pod.namespace, name=pod.name, verdict=Verdict.EFFICIENT if good else Verdict.UNDERUTILIZED,
            diagnosis=Diagnosis.COMPUTE_BOUND if good else Diagnosis.LOW_COMPUTE, recommendation="",
            activity_signal=signal, activity_peak=peak, activity_avg=avg, gpu_util_avg=util, efficiency=efficiency, gpus=uuids,
            reason=f"average activity {avg:.3f} (underutilization diagnosis disabled)",
        )  # fmt: skip
        return PodRecord(pod, verdict, activities, (), sharing)

    findings = tuple(
        [diagnose(w, a, params, b, s.fb_total_mib)
         for s, w, a, b in zip(samples, windows, activities, bounds, strict=True)]
    )  # fmt: skip
    best_index = min(range(len(findings)), key=lambda i: findings[i].rank) if len(findings) > 1 else 0
    best = findings[best_index]
    where = f" on GPU {uuids[best_index]}" if len(findings) > 1 else ""
    reason = f"{_VALUE[best.diagnosis]}{where}: {best.evidence}" + (f" ({sharing})" if sharing else "")
    verdict = PodVerdict(
        namespace=pod.namespace, name=pod.name, verdict=verdict_of(best.diagnosis, avg, params), diagnosis=best.diagnosis, recommendation=best.recommendation,
        activity_signal=signal, activity_peak=peak, activity_avg=avg, gpu_util_avg=util, efficiency=efficiency, gpus=uuids, reason=reason,
    )  # fmt: skip
    return PodRecord(pod, verdict, activities, findings, sharing)


def _act(
    record: PodRecord,
    params: CycleParams,
    now: float,
    policy_name: str,
    notes: list[str],
    remembered: IdleClock | None = None,
    group: OwnerGroup | None = None,
) -> None:
    """Lifecycle, annotation patch and events of one judged pod (written into the record).
    ``group``: its owner's group when owners were read (reclaim.py), whose blocker holds the pod;
    ``remembered``: the clock this process wrote for the pod (idleledger.py)."""
    pod = record.pod
    verdict = record.verdict
    current = pod.annotations
    idle_enforced = verdict.verdict is Verdict.IDLE and params.enforce
    blocker = permanent_blocker(pod, params) if idle_enforced else ""
    if group is not None and idle_enforced and not blocker:
        blocker = group.blocker
    subject = "the pod will be evicted" if group is None else action_words(group.owner, group.action)
    lifecycle = idle_lifecycle(
        pod,
        verdict.verdict,
        params,
        now,
        evidence=verdict.reason,
        blocker=blocker,
        subject=subject,
        remembered=remembered,
    )
    record.lifecycle = lifecycle
    if blocker and lifecycle.hold == blocker:
        notes.append(f"{pod.namespace}/{pod.name}: idle but never warned or evicted: {blocker}")
    desired = desired_annotations(
        verdict, state_value(verdict.verdict, lifecycle.warned), policy_name, current
    )
    if not params.under_enabled and verdict.verdict not in (Verdict.IDLE, Verdict.UNKNOWN):
        desired[names.DIAGNOSIS] = None
        desired[names.RECOMMENDATION] = None
    if lifecycle.warned and params.allow_keep_until and verdict.verdict is Verdict.IDLE:
        # the warning's annotation ends with the one line that keeps the GPU, as its event does
        desired[names.RECOMMENDATION] = ending_with(
            verdict.recommendation,
            f". To keep it: {keep_command(pod.namespace, pod.name, params.max_keep_s)}",
        )
    patch = annotation_patch(current, desired)
    if lifecycle.updates:
        patch.update(lifecycle.updates)
    record.patch = patch
    events = [
        PodEvent(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            reason=e.reason,
            message=e.message,
            type=e.type,
        )
        for e in lifecycle.events
    ]
    if (
        verdict.verdict is Verdict.UNDERUTILIZED
        and params.under_enabled
        and current.get(names.DIAGNOSIS) != _VALUE[verdict.diagnosis]
    ):
        events.append(
            PodEvent(
                namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=names.EV_UNDERUTILIZED,
                message=f"this GPU is underused ({_VALUE[verdict.diagnosis].replace('-', ' ')}): "
                f"{verdict.recommendation}. Evidence: {verdict.reason}",
            )
        )  # fmt: skip
    if (
        idle_enforced  # in Observe mode nothing is reclaimed: "not reclaimed because" would be noise
        and group is not None
        and group.blocker
        and patch.get(names.RECOMMENDATION) is not None
    ):
        events.append(
            PodEvent(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                reason=names.EV_RECLAIM_SKIPPED,
                message=f"{group.describe()}",
            )
        )
    record.events = tuple(events)


def _status(
    snapshot: Snapshot,
    params: CycleParams,
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
    ``unattributed`` (see ``_unattributed``) makes MetricsAvailable False although the source answered.
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
    if snapshot.metrics_available and unattributed:
        if condition_flipped(conditions, names.COND_METRICS, "False"):
            events.append(
                PolicyEvent(
                    reason=names.EV_METRICS_UNAVAILABLE,
                    message=f"{unattributed}: the pods stay Unknown and are never evicted",
                    type="Warning",
                )
            )
        conditions = set_condition(
            conditions,
            type=names.COND_METRICS,
            status="False",
            reason="NoPodSamples",
            message=unattributed,
            now=now,
            generation=generation,
        )
        conditions = set_condition(
            conditions, type=names.COND_READY, status="True", reason="Evaluated",
            message=f"{len(verdicts)} pods and {gpus_evaluated} GPUs evaluated", now=now, generation=generation,
        )  # fmt: skip
    elif snapshot.metrics_available:
        untrusted = ", ".join(f"{reason} {count}" for reason, count in (dropped or {}).items())
        conditions = set_condition(
            conditions, type=names.COND_METRICS, status="True", reason="MetricsRead",
            message=f"samples for {len(snapshot.gpus)} GPUs"
            + (f"; dropped as untrustworthy: {untrusted}" if untrusted else ""), now=now, generation=generation,
        )  # fmt: skip
        conditions = set_condition(
            conditions, type=names.COND_READY, status="True", reason="Evaluated",
            message=f"{len(verdicts)} pods and {gpus_evaluated} GPUs evaluated", now=now, generation=generation,
        )  # fmt: skip
    else:
        message = snapshot.metrics_error or "the metrics source failed"
        if condition_flipped(conditions, names.COND_METRICS, "False"):
            events.append(
                PolicyEvent(
                    reason=names.EV_METRICS_UNAVAILABLE,
                    message=f"{message}: no pod is judged or evicted",
                    type="Warning",
                )
            )
        conditions = set_condition(
            conditions,
            type=names.COND_METRICS,
            status="False",
            reason="SourceUnavailable",
            message=message,
            now=now,
            generation=generation,
        )
        conditions = set_condition(
            conditions, type=names.COND_READY, status="False", reason="MetricsUnavailable",
            message="metrics unavailable: verdicts Unknown, nothing evicted", now=now, generation=generation,
        )  # fmt: skip
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
            conditions, type=names.COND_BREAKER, status=state, reason="TooManyFaultyNodes" if faults.breaker_open else "Closed",
            message=faults.breaker_message, now=now, generation=generation,
        )  # fmt: skip
        quarantined = [
            QuarantinedNode(node=q.node, kind=q.kind, gpus=list(q.gpus), tainted=q.tainted, since=q.since)
            for q in faults.quarantined
        ]
    hours = elapsed_hours(previous.last_evaluation_time, now, params.interval_s)
    waste = idle_waste(idle_gpu_models, params.prices, hours)
    waiting = [p for p in snapshot.pending if waiting_for_gpus(p)]
    reclamations, returned = advance(previous.reclamations, snapshot.pods, snapshot.owners, now, hours)
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
            "pending_gpu_demand": PendingGpuDemand(
                pods=len(waiting), gpus=sum(p.gpu_request for p in waiting)
            ),
            "reclamations": reclamations,
            "gpu_hours_returned": previous.gpu_hours_returned + returned,
        }
    )
    return status, events


def _metrics_unavailable(
    snapshot: Snapshot, params: CycleParams, in_scope: list[PodView], shadowed: Mapping[str, int]
) -> Plan:
    """Prometheus down: every pod Unknown, no pod writes, a condition and (on the flip) an event.

    The faults engine still runs (it detects nothing without data but applies manual recoveries);
    any TaintNode or TaintDevices it might return is dropped here all the same: no new taints without data.
    """
    reason = f"metrics unavailable: {snapshot.metrics_error or 'the metrics source failed'}"
    verdicts = tuple([_unknown(pod, reason) for pod in in_scope])
    warned = sum(1 for pod in in_scope if names.EVICT_AFTER in pod.annotations)
    faults = evaluate_faults(snapshot)
    fault_actions = [a for a in faults.actions if not isinstance(a, (TaintNode, TaintDevices))]
    notes = [reason, *faults.notes]
    if len(fault_actions) < len(faults.actions):
        notes.append("taints dropped: no new taint while metrics are unavailable")
    status, events = _status(
        snapshot, params, verdicts, 0, warned, [], faults, shadowed, "", snapshot.dropped_samples
    )
    return Plan(actions=(*fault_actions, *events), verdicts=verdicts, status=status, notes=tuple(notes))


def _unattributed(
    in_scope: Sequence[PodView], pod_gpus: Mapping[PodKey, list[GPUSample]], gpus: int, ctx: _Context
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


def _pods_under_pressure(
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


def _claimed_by(pod: PodView, seniors: list[tuple[str, Scope]]) -> str:
    """Overlapping policies: the oldest (then by name) judges the pod, so annotations never flap.
    Returns that policy's name ('' when no senior selects the pod)."""
    for name, senior in seniors:
        if not senior.exclusion(pod):
            return name
    return ""


def _shadowed_condition(
    conditions: list[Condition], shadowed: Mapping[str, int], now: float, generation: int
) -> tuple[list[Condition], list[PolicyEvent]]:
    """The Shadowed condition: which older policies judge pods this policy selects, and how many.

    A Warning event goes out when the set of winning policies changes (not on every pod count
    change, which churns with the workload), so an admin learns once why this policy acts on less.
    """
    if not shadowed:
        return set_condition(
            conditions, type=names.COND_SHADOWED, status="False", reason="NoOverlap",
            message="no older policy selects this policy's pods", now=now, generation=generation,
        ), []  # fmt: skip
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


def evaluate(
    snapshot: Snapshot,
    focus: PodKey | None = None,
    memo: JudgeMemo | None = None,
    ledger: IdleLedger | None = None,
) -> Evaluation:
    """The cycle's plan, and for ``focus`` the record that explains its verdict. ``memo``: the
    previous cycle's verdicts, reused where a pod's inputs are unchanged (``judgememo.py``);
    ``ledger``: the idle clocks this process wrote, kept across cycles (``idleledger.py``)."""
    params = cycle_params(snapshot.policy)
    now = snapshot.now
    if ledger is not None:
        ledger.begin(now, params.interval_s)
    scope: Scope = build_scope(
        snapshot.policy.selection, snapshot.protected_namespaces, snapshot.namespaces, snapshot.nodes
    )
    seniors = [
        (
            senior.name,
            build_scope(senior.selection, snapshot.protected_namespaces, snapshot.namespaces, snapshot.nodes),
        )
        for senior in snapshot.senior_policies
    ]
    in_scope: list[PodView] = []
    cleanups: list[Action] = []
    shadowed: dict[str, int] = {}
    focus_exclusion = ""
    for pod in snapshot.pods:
        if pod.namespace in scope.protected:  # never touched, not even cleaned up
            if focus == (pod.namespace, pod.name):
                focus_exclusion = scope.exclusion(pod)
            continue
        why = scope.exclusion(pod)
        if not why:
            winner = _claimed_by(pod, seniors)
            if winner:
                shadowed[winner] = shadowed.get(winner, 0) + 1
                why = f"judged by policy {winner}, which takes precedence (created earlier)"
        if not why:
            in_scope.append(pod)
            continue
        if focus == (pod.namespace, pod.name):
            focus_exclusion = why
        if (
            pod.annotations.get(names.POLICY) == snapshot.policy_name
            and pod.phase == "Running"
            and not pod.deleting
        ):
            patch = cleanup_patch(pod.annotations)
            if patch:
                cleanups.append(
                    AnnotatePod(namespace=pod.namespace, name=pod.name, uid=pod.uid, annotations=patch)
                )

    if not snapshot.metrics_available:
        plan = _metrics_unavailable(snapshot, params, in_scope, shadowed)
        record = None
        if focus is not None:
            for verdict, pod in zip(plan.verdicts, in_scope, strict=True):
                if (pod.namespace, pod.name) == focus:
                    record = PodRecord(pod, verdict)
        return Evaluation(plan, params, record, focus_exclusion)

    vetted = vet_samples(snapshot.gpus, snapshot.pods, snapshot.nodes)
    dropped = merged_counts(snapshot.dropped_samples, vetted.dropped)
    snapshot = replace(snapshot, gpus=vetted.gpus)
    pod_gpus = _index_pods(snapshot.gpus)
    if memo is not None:
        memo.begin(params)
    ctx = _Context(params, now, pod_gpus, memo)
    policy_name = snapshot.policy_name
    actions: list[Action] = []
    verdicts: list[PodVerdict] = []
    candidates: list[EvictionCandidate] = []
    notes: list[str] = []
    idle_gpus: dict[str, tuple[str, str]] = {}
    evaluated_gpus: set[str] = set()
    node_products = {n.name: n.labels.get(names.GPU_PRODUCT_LABEL, "") for n in snapshot.nodes}
    warned = 0
    focused: PodRecord | None = None
    clocks: dict[str, IdleClock] = {}
    records: list[PodRecord] = []
    for pod in in_scope:
        key = (pod.namespace, pod.name)
        record = _judge(pod, key, ctx)
        evaluated_gpus.update(record.verdict.gpus)
        if record.verdict.verdict is Verdict.IDLE:
            for sample in pod_gpus[key]:
                idle_gpus[sample.uuid] = (sample.model, node_products.get(sample.node, ""))
        records.append(record)
    owners: OwnerPlan | None = None
    if snapshot.owners is not None:
        owners = group_owners(
            snapshot,
            [p for p in snapshot.pods if p.namespace not in scope.protected],
            {(r.pod.namespace, r.pod.name): r.verdict.verdict for r in records},
            params,
            {(r.pod.namespace, r.pod.name): r.verdict.gpus for r in records},
        )
    stragglers = evaluate_stragglers(
        snapshot, in_scope, pod_gpus, ctx.bounds,
        straggler_params(snapshot.policy.stragglers, params.under.temperature_limit_celsius, params.min_pod_age_s),
        ctx.activity,
    )  # fmt: skip
    notes.extend(stragglers.notes)
    for record in records:
        pod = record.pod
        key = (pod.namespace, pod.name)
        group = owners.of_pod.get(key) if owners is not None else None
        if group is not None and record.verdict.verdict is Verdict.IDLE:
            record.verdict = replace(record.verdict, recommendation=group.recommendation)
            record.owner = group.describe()
            record.owner_label = group.owner.label
            notes.append(f"{pod.namespace}/{pod.name}: {record.owner}")
        verdicts.append(record.verdict)
        _act(
            record, params, now, policy_name, notes,
            ledger.get(pod.uid) if ledger is not None else None, group,
        )  # fmt: skip
        straggler_patch = stragglers.patches.get(key)
        if straggler_patch:
            record.patch = {**record.patch, **straggler_patch}
        lifecycle = record.lifecycle
        if lifecycle is not None:
            if lifecycle.clock:
                clocks[pod.uid] = lifecycle.clock
            warned += lifecycle.warned
            if lifecycle.candidate is not None:
                candidates.append(lifecycle.candidate)
        if record.patch:
            actions.append(
                AnnotatePod(namespace=pod.namespace, name=pod.name, uid=pod.uid, annotations=record.patch)
            )
        actions.extend(record.events)
        if key == focus:
            focused = record
    actions.extend(stragglers.events)
    actions.extend(cleanups)

    holding = {
        n.name for n in snapshot.nodes if FaultKind.STRAGGLER in n.annotations.get(names.NODE_FAULTS, "")
    }
    faults = evaluate_faults(snapshot, straggler_judgements(stragglers, holding))
    notes.extend(faults.notes)
    actions.extend(faults.actions)
    recent = recent_within_hour(snapshot.status.recent_evictions, now)
    destructive: list[Action] = []
    cluster = Pressure(snapshot.nodes, snapshot.pods, snapshot.pending)
    drafts: tuple[tuple[tuple[Action, ...], Reclamation], ...] = ()
    if owners is None:
        if params.on_pressure:
            candidates = _pods_under_pressure(candidates, cluster, notes)
        selection = select_evictions(candidates, params, now, len(recent))
        notes.extend(selection.notes)
        destructive.extend(
            EvictPod(
                namespace=c.pod.namespace,
                name=c.pod.name,
                uid=c.pod.uid,
                reason=f"{c.message} (policy {policy_name})",
            )
            for c in selection.selected
        )
    else:
        reclaims = select_reclaims(owners, candidates, params, now, len(recent), policy_name, cluster)
        notes.extend(reclaims.notes)
        destructive.extend(reclaims.actions)
        drafts = reclaims.records
    status, policy_events = _status(
        snapshot, params, verdicts, len(evaluated_gpus), warned, list(idle_gpus.values()), faults,
        shadowed, _unattributed(in_scope, pod_gpus, len(snapshot.gpus), ctx), dropped,
    )  # fmt: skip
    actions.extend(policy_events)
    actions.extend(destructive)
    plan = Plan(
        actions=tuple(actions), verdicts=tuple(verdicts), status=status, notes=tuple(notes),
        stragglers=tuple(stragglers.groups), straggler_groups=stragglers.views(), reclamations=drafts,
    )  # fmt: skip
    if memo is not None:
        memo.end()
    if ledger is not None:
        ledger.end(clocks)
    return Evaluation(plan, params, focused, focus_exclusion)


def plan_cycle(snapshot: Snapshot, memo: JudgeMemo | None = None, ledger: IdleLedger | None = None) -> Plan:
    """Judge every pod in scope and plan this cycle's writes; pure: the same snapshot gives the same
    plan, with or without ``memo`` (the previous cycle's verdicts, for unchanged inputs only).
    ``ledger`` (the idle clocks this process wrote) is read and updated: with it, edits of the
    operator's idle annotations cannot move the clocks later."""
    return evaluate(snapshot, memo=memo, ledger=ledger).plan


def explain_pod(snapshot: Snapshot, namespace: str, name: str) -> list[str]:
    """Human-readable lines: every signal, threshold and rule behind one pod's verdict and actions."""
    evaluation = evaluate(snapshot, focus=(namespace, name))
    return explain_lines(snapshot, evaluation, namespace, name)


__all__ = ["evaluate", "explain_pod", "plan_cycle"]
