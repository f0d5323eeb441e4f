"""One evaluation cycle: snapshot in, plan out (verdicts, pod actions, evictions, faults, status).

Order of the plan's actions: per pod its annotation patch then its events; then fault actions and
policy events; evictions last, so every warning and annotation is written before anything
destructive happens.

The steps live beside it: judging a pod (reclaim/judge.py), its writes (reclaim/actions.py), evictions
and reclaims (reclaim/budgets.py, reclaim/reclaim.py), faults (quarantine/evaluate.py) and the policy's status
(policy_status.py); this module orders them and holds no rule of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpu_efficiency.api import names
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.engine.evaluation import Evaluation
from gpu_efficiency.engine.explain import explain_lines
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    EvictPod,
    Plan,
    PodVerdict,
    PodView,
    Snapshot,
    TaintDevices,
    TaintNode,
    Verdict,
)
from gpu_efficiency.engine.params import CycleParams, cycle_params
from gpu_efficiency.engine.policy_status import policy_status, unattributed
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults
from gpu_efficiency.engine.quarantine.kinds import FaultKind
from gpu_efficiency.engine.reclaim.actions import act, is_quiet, stay_quiet
from gpu_efficiency.engine.reclaim.activity import evidence_reach
from gpu_efficiency.engine.reclaim.annotations import cleanup_patch
from gpu_efficiency.engine.reclaim.budgets import EvictionCandidate, recent_within_hour, select_evictions
from gpu_efficiency.engine.reclaim.idle import PodKey
from gpu_efficiency.engine.reclaim.idleledger import IdleClock, IdleLedger
from gpu_efficiency.engine.reclaim.judge import JudgeContext, index_pods, judge, unknown_verdict
from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo
from gpu_efficiency.engine.reclaim.ownerholds import with_holds
from gpu_efficiency.engine.reclaim.ownerreads import starts_idle_clock
from gpu_efficiency.engine.reclaim.reclaim import (
    OwnerPlan,
    Pressure,
    group_owners,
    pods_under_pressure,
    select_reclaims,
)
from gpu_efficiency.engine.reclaim.record import PodRecord
from gpu_efficiency.engine.selection import Scope, build_scope, claimed_by
from gpu_efficiency.engine.stragglers.evaluate import (
    evaluate_stragglers,
    straggler_judgements,
    straggler_params,
)
from gpu_efficiency.engine.trust import merged_counts, vet_samples


def _metrics_unavailable(
    snapshot: Snapshot, params: CycleParams, in_scope: list[PodView], shadowed: Mapping[str, int]
) -> Plan:
    """Prometheus down: every pod Unknown, no pod writes, a condition and (on the flip) an event.

    The faults engine still runs (it detects nothing without data but applies manual recoveries);
    any TaintNode or TaintDevices it might return is dropped here all the same: no new taints without data.
    """
    reason = f"metrics unavailable: {snapshot.metrics_error or 'the metrics source failed'}"
    verdicts = tuple([unknown_verdict(pod, reason) for pod in in_scope])
    warned = sum(1 for pod in in_scope if names.EVICT_AFTER in pod.annotations)
    faults = evaluate_faults(snapshot, params=params)
    fault_actions = [a for a in faults.actions if not isinstance(a, (TaintNode, TaintDevices))]
    notes = [reason, *faults.notes]
    if len(fault_actions) < len(faults.actions):
        notes.append("taints dropped: no new taint while metrics are unavailable")
    status, events = policy_status(
        snapshot,
        params,
        verdicts=verdicts,
        gpus_evaluated=0,
        warned=warned,
        idle_gpu_models=[],
        faults=faults,
        shadowed=shadowed,
        dropped=snapshot.dropped_samples,
    )
    return Plan(actions=(*fault_actions, *events), verdicts=verdicts, status=status, notes=tuple(notes))


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
            winner = claimed_by(pod, seniors)
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
    pod_gpus = index_pods(snapshot.gpus)
    if memo is not None:
        memo.begin(params)
    ctx = JudgeContext(params, now, pod_gpus, memo)
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
        record = judge(pod, key, ctx)
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
        snapshot,
        in_scope,
        straggler_params(
            snapshot.policy.stragglers, params.under.temperature_limit_celsius, params.min_pod_age_s
        ),
        pod_gpus=pod_gpus,
        bounds_of=ctx.bounds,
        activity_of=ctx.activity,
    )
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
        if memo is not None and memo.still_quiet(key, pod, record.verdict):
            stay_quiet(record)  # unchanged and quiet: its actions are nothing again (judgememo.py)
        else:
            act(
                record,
                params,
                now=now,
                policy_name=policy_name,
                notes=notes,
                reach=evidence_reach(pod_gpus[key], record.activities, now + params.scrape_interval_s)
                if record.verdict.verdict is Verdict.IDLE
                else None,
                remembered=ledger.get(pod.uid) if ledger is not None else None,
                group=group,
            )
            if memo is not None and is_quiet(record):
                memo.mark_quiet(key, pod, record.verdict)
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
    faults = evaluate_faults(snapshot, straggler_judgements(stragglers, holding), params=params)
    notes.extend(faults.notes)
    actions.extend(faults.actions)
    recent = recent_within_hour(snapshot.status.recent_evictions, now)
    destructive: list[Action] = []
    cluster = Pressure(snapshot.nodes, snapshot.pods, snapshot.pending)
    drafts: tuple[tuple[tuple[Action, ...], Reclamation], ...] = ()
    if owners is None:
        if params.on_pressure:
            candidates = pods_under_pressure(candidates, cluster, notes)
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
        reclaims = select_reclaims(
            owners,
            candidates,
            params,
            now=now,
            actions_last_hour=len(recent),
            policy_name=policy_name,
            cluster=cluster,
        )
        notes.extend(reclaims.notes)
        destructive.extend(reclaims.actions)
        drafts = reclaims.records
    status, policy_events = policy_status(
        snapshot,
        params,
        verdicts=verdicts,
        gpus_evaluated=len(evaluated_gpus),
        warned=warned,
        idle_gpu_models=list(idle_gpus.values()),
        faults=faults,
        shadowed=shadowed,
        unattributed=unattributed(in_scope, pod_gpus, len(snapshot.gpus), ctx),
        dropped=dropped,
    )
    actions.extend(policy_events)
    if owners is not None:
        status = with_holds(status, owners.new_holds, now, params.max_keep_s)
        actions.extend(owners.events)
    actions.extend(destructive)
    plan = Plan(
        actions=tuple(actions),
        verdicts=tuple(verdicts),
        status=status,
        notes=tuple(notes),
        stragglers=tuple(stragglers.groups),
        straggler_groups=stragglers.views(),
        reclamations=drafts,
    )
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


@dataclass
class Memory:
    """What the engine keeps for one policy between cycles, in this process only: the last cycle's
    verdicts (reused for unchanged inputs) and the idle clocks it wrote."""

    memo: JudgeMemo = field(default_factory=JudgeMemo)
    ledger: IdleLedger = field(default_factory=IdleLedger)

    def forget_clocks(self) -> None:
        """Another replica leads: it may reset clocks meanwhile, so ours are no longer evidence."""
        self.ledger = IdleLedger()


def plan(
    snapshot: Snapshot, memory: Memory, *, with_owners: Callable[[], Snapshot | None] | None = None
) -> tuple[Snapshot, Plan]:
    """Plan the cycle; returns the snapshot the plan was made from with the plan.

    A pod that turns idle while no idle clock ran had its owners unread (``pods/ownerreads.py``):
    its first idle annotation would carry the owner-blind recommendation and the next cycle, with
    the owners read, would rewrite it (a second patch and a ReclaimSkipped event per pod). Then
    ``with_owners`` (the snapshot with the owners read, None when they could not be) is asked for
    and the cycle judged once more (the judgements come from the memo).
    """
    before = memory.ledger.checkpoint()
    first = plan_cycle(snapshot, memory.memo, memory.ledger)
    if (
        with_owners is None
        or snapshot.owners is not None
        or not starts_idle_clock(snapshot.pods, first.verdicts)
    ):
        return snapshot, first
    richer = with_owners()
    if richer is None:
        return snapshot, first
    memory.ledger.restore(before)
    return richer, plan_cycle(richer, memory.memo, memory.ledger)


def explain_pod(snapshot: Snapshot, namespace: str, name: str) -> list[str]:
    """Human-readable lines: every signal, threshold and rule behind one pod's verdict and actions."""
    evaluation = evaluate(snapshot, focus=(namespace, name))
    return explain_lines(snapshot, evaluation, namespace, name)


__all__ = ["Memory", "evaluate", "explain_pod", "plan", "plan_cycle"]
