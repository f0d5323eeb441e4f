"""What one judged pod's verdict writes: its idle lifecycle, its annotation patch and its events.

The judge (judge.py) only decides; this turns the decision into writes, quiet while nothing changes
(annotations.py) and with an event only when the state changes. The planner orders them in the plan.
A quiet pod's actions (``is_quiet``) are nothing again while its view and verdict stay the same
(judgememo.py), so the planner may skip them (``stay_quiet``).
"""

from __future__ import annotations

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import Diagnosis, PodEvent, Verdict
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.acknowledge import ending_with, keep_command
from gpu_efficiency.engine.reclaim.activity import EvidenceReach
from gpu_efficiency.engine.reclaim.annotations import annotation_patch, desired_annotations, state_value
from gpu_efficiency.engine.reclaim.budgets import permanent_blocker
from gpu_efficiency.engine.reclaim.idle import NO_LIFECYCLE, idle_lifecycle
from gpu_efficiency.engine.reclaim.idleledger import IdleClock
from gpu_efficiency.engine.reclaim.judge import PLAIN_VALUE
from gpu_efficiency.engine.reclaim.owners import action_words
from gpu_efficiency.engine.reclaim.reclaim import OwnerGroup
from gpu_efficiency.engine.reclaim.record import PodRecord


def _underused_words(diagnosis: Diagnosis) -> str:
    """How the GPUUnderutilized event starts: a hardware cause is not blamed on the pod's owner."""
    if diagnosis is Diagnosis.THERMAL_THROTTLING:
        return "this GPU is slowed by heat (thermal throttling), not by your code"
    return f"this GPU is underused ({PLAIN_VALUE[diagnosis].replace('-', ' ')})"


def act(
    record: PodRecord,
    params: CycleParams,
    *,
    now: float,
    policy_name: str,
    notes: list[str],
    reach: EvidenceReach | None,
    remembered: IdleClock | None = None,
    group: OwnerGroup | None = None,
) -> None:
    """Lifecycle, annotation patch and events of one judged pod (written into the record).
    ``group``: its owner's group when owners were read (reclaim.py), whose blocker holds the pod;
    ``remembered``: the clock this process wrote for the pod (idleledger.py); ``reach``: how far in
    time its idle evidence reaches (activity.evidence_reach; None when it is not Idle)."""
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
        reach=reach,
        remembered=remembered,
    )
    record.lifecycle = lifecycle
    if blocker and lifecycle.hold == blocker:
        notes.append(f"{pod.namespace}/{pod.name}: idle but never warned or evicted: {blocker}")
    if lifecycle.awaiting_evidence:  # the wait is visible: the warning stands, and this says why
        notes.append(f"{pod.namespace}/{pod.name}: {lifecycle.hold}")
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
        and current.get(names.DIAGNOSIS) != PLAIN_VALUE[verdict.diagnosis]
    ):
        events.append(
            PodEvent(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                reason=names.EV_UNDERUTILIZED,
                message=f"{_underused_words(verdict.diagnosis)}: {verdict.recommendation}. Evidence: {verdict.reason}",
            )
        )
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


def is_quiet(record: PodRecord) -> bool:
    """True when the pod's actions wrote nothing and had no idle lifecycle to run: they then read
    only its view, its verdict and the parameters, never the clock, its owner or the idle ledger."""
    return record.lifecycle is NO_LIFECYCLE and not record.patch and not record.events


def stay_quiet(record: PodRecord) -> None:
    """What ``act`` gives a pod that was quiet last cycle with the same view and verdict."""
    record.lifecycle = NO_LIFECYCLE
    record.patch = {}
    record.events = ()
