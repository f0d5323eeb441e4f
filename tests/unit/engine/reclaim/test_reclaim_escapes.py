"""The owners that used to keep an idle GPU for ever (issue: HPA targets, standalone ReplicaSets,
CronJob Jobs, unknown controllers, owners already at 0 replicas), and what a reclamation that does
not hold leads to (ReclaimReverted, ReclaimIneffective): never a fight, never a loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, enforce, gpu, no_faults, snapshot  # noqa: F401 (fixture)
from tests.unit.engine.owner_builders import chain, due_annotations, obj, our_record, owned, with_owners

from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    EvictPod,
    OwnerEvent,
    OwnerObject,
    PodEvent,
    PodView,
    PolicyEvent,
    ReclaimOwner,
    Snapshot,
)
from gpu_efficiency.engine.planner import plan_cycle

pytestmark = pytest.mark.usefixtures("no_faults")


def cluster(
    pods: list[PodView],
    objects: list[OwnerObject],
    *,
    spec: Any = None,
    status: GPUEfficiencyPolicyStatus | None = None,
    now: float = NOW,
    **owners: Any,
) -> Snapshot:
    gpus = [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    snap = with_owners(snapshot(gpus, pods, spec or enforce()), objects, **owners)
    return replace(snap, status=status or snap.status, now=now)


def of(actions: tuple[Action, ...], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_an_hpa_target_is_scaled_to_zero_and_the_hpa_recorded() -> None:
    """It used to be Recommend only. The HPA controller stops at 0 replicas (ScalingDisabled)."""
    pods = [owned(f"api-{i}", ("ReplicaSet", "api-5d9"), annotations=due_annotations()) for i in range(2)]
    objects = chain(("ReplicaSet", "api-5d9"), ("Deployment", "api"), replicas=2)
    plan = plan_cycle(cluster(pods, objects, autoscalers={("team-a", "Deployment", "api"): "api-hpa"}))
    (action,) = of(plan.actions, ReclaimOwner)
    assert (action.action, action.owner.kind, action.owner.name, action.autoscaler) == (
        "ScaleToZero",
        "Deployment",
        "api",
        "api-hpa",
    )
    assert "horizontalpodautoscaler/api-hpa stops scaling it at 0 replicas (ScalingDisabled)" in action.reason
    assert not [e for e in of(plan.actions, PodEvent) if e.reason == names.EV_RECLAIM_SKIPPED]


def test_a_standalone_replicaset_is_scaled_to_zero() -> None:
    pods = [owned("w-0", ("ReplicaSet", "w"), annotations=due_annotations())]
    plan = plan_cycle(cluster(pods, [obj("ReplicaSet", "w")]))
    assert [(a.action, a.owner.kind, a.owner.name) for a in of(plan.actions, ReclaimOwner)] == [
        ("ScaleToZero", "ReplicaSet", "w")
    ]


@pytest.mark.parametrize(
    ("concurrency", "says"),
    [
        ("Allow", "cronjob/nightly is left alone: its next scheduled run will start as usual"),
        ("Replace", "its next scheduled run will start and replace this suspended Job"),
        ("Forbid", "concurrencyPolicy Forbid starts no new run while this suspended Job exists"),
    ],
)
def test_a_cronjobs_job_is_suspended_not_the_cronjob(concurrency: str, says: str) -> None:
    pods = [owned("nightly-1-x", ("Job", "nightly-1"), annotations=due_annotations())]
    objects = chain(("Job", "nightly-1"), ("CronJob", "nightly"))
    objects[-1] = replace(objects[-1], concurrency_policy=concurrency)
    plan = plan_cycle(cluster(pods, objects))
    (action,) = of(plan.actions, ReclaimOwner)
    assert (action.action, action.owner.kind, action.owner.name) == ("Suspend", "Job", "nightly-1")
    assert says in action.reason


def unknown_pod(**fields: Any) -> PodView:
    return owned("solo", ("ConfigMap", "cm"), **({"annotations": due_annotations()} | fields))


def test_a_pod_of_an_unknown_controller_is_evicted_and_says_why() -> None:
    """It used to be Recommend only: a ConfigMap as controller kept an idle GPU for ever."""
    plan = plan_cycle(cluster([unknown_pod()], []))
    (evict,) = of(plan.actions, EvictPod)
    assert evict.name == "solo"
    assert "configmap/cm cannot be acted on" in evict.reason
    assert "idle.allowOptOut is false" in evict.reason
    assert plan.reclamations[0][1].owner == "team-a/ConfigMap/cm"


def test_an_unknown_controller_is_an_opt_out_only_where_allowed_and_for_max_keep() -> None:
    spec = enforce(idle={"allow_opt_out": True, "max_keep": "24h"})
    held = plan_cycle(cluster([unknown_pod()], [], spec=spec))
    assert of(held.actions, EvictPod) == []
    assert any("honoured as an opt-out (idle.allowOptOut)" in n for n in held.notes)
    warned_long_ago = {**due_annotations(), names.EVICT_AFTER: format_rfc3339(NOW - 24 * 3600)}
    later = plan_cycle(cluster([unknown_pod(annotations=warned_long_ago)], [], spec=spec))
    (evict,) = of(later.actions, EvictPod)
    assert "honoured as an opt-out for maxKeep 24h, which is over" in evict.reason
    bare_ok = enforce(idle={"allow_opt_out": True}, eviction={"allow_bare_pods": True})
    assert [a.name for a in of(plan_cycle(cluster([unknown_pod()], [], spec=bare_ok)).actions, EvictPod)] == [
        "solo"
    ]


def evicted(owner: str, at: float) -> Reclamation:
    return Reclamation(owner=owner, action="Evict", time=format_rfc3339(at), controllers=["ConfigMap/cm"])


def test_an_evicted_pod_that_comes_back_idle_is_reclaim_ineffective_once() -> None:
    status = GPUEfficiencyPolicyStatus(reclamations=[evicted("team-a/ConfigMap/cm", NOW - 7200)])
    back = unknown_pod(start_time=NOW - 3600)  # the replacement, started after the eviction
    plan = plan_cycle(cluster([back], [], status=status))
    assert of(plan.actions, EvictPod) == []
    events = [e for e in of(plan.actions, PodEvent) if e.reason == names.EV_RECLAIM_INEFFECTIVE]
    assert [e.name for e in events] == ["solo"]
    assert [e.reason for e in of(plan.actions, PolicyEvent)].count(names.EV_RECLAIM_INEFFECTIVE) == 1
    assert plan.status.reclaims_ineffective_total == 1
    (hold,) = plan.status.owner_holds
    assert (hold.owner, hold.reason) == ("team-a/ConfigMap/cm", names.EV_RECLAIM_INEFFECTIVE)
    assert parse_rfc3339(hold.until) == NOW + 24 * 3600
    # restart-safe: the next cycle reads the hold from status, reports nothing and evicts nothing
    again = plan_cycle(cluster([back], [], status=plan.status, now=NOW + 60))
    assert of(again.actions, EvictPod) == []
    assert not [e for e in of(again.actions, PodEvent) if e.reason == names.EV_RECLAIM_INEFFECTIVE]
    assert again.status.reclaims_ineffective_total == 1


def test_the_pod_evicted_itself_is_not_a_comeback() -> None:
    status = GPUEfficiencyPolicyStatus(reclamations=[evicted("team-a/ConfigMap/cm", NOW - 60)])
    plan = plan_cycle(cluster([unknown_pod(start_time=NOW - 86400)], [], status=status))
    assert [a.name for a in of(plan.actions, EvictPod)] == ["solo"]  # still there: tried again


def zeroed(annotations: dict[str, str]) -> tuple[list[PodView], list[OwnerObject]]:
    pods = [owned("z-0", ("ReplicaSet", "z-1"), annotations=due_annotations())]
    return pods, chain(("ReplicaSet", "z-1"), ("Deployment", "z"), replicas=0, annotations=annotations)


def test_an_owner_at_zero_with_a_forged_reclaimed_record_does_not_hold_its_pods() -> None:
    """It used to be held for ever as 'already reclaimed: its pods are going'."""
    pods, objects = zeroed({names.RECLAIMED: "ScaleToZero"})
    plan = plan_cycle(cluster(pods, objects))
    (evict,) = of(plan.actions, EvictPod)
    assert "deployment/z is already at 0 replicas but not by this policy" in evict.reason
    unannotated = plan_cycle(cluster(*zeroed({})))  # a decoy at 0 needs no annotation to hold a GPU
    assert [a.name for a in of(unannotated.actions, EvictPod)] == ["z-0"]
    ours = GPUEfficiencyPolicyStatus(reclamations=[our_record("Deployment", "z")])
    assert of(plan_cycle(cluster(pods, objects, status=ours)).actions, EvictPod) == []


def reclaimed_web(replicas: int, *, restored: bool = False) -> tuple[list[PodView], list[OwnerObject]]:
    record = {} if restored else {names.RECLAIMED: "ScaleToZero", names.PREVIOUS_REPLICAS: "2"}
    pods = [
        owned(f"web-{i}", ("ReplicaSet", "web-2"), annotations=due_annotations()) for i in range(replicas)
    ]
    return pods, chain(("ReplicaSet", "web-2"), ("Deployment", "web"), replicas=replicas, annotations=record)


def scaled_web(at: float) -> Reclamation:
    return our_record("Deployment", "web", time=format_rfc3339(at), replicas=2)


def test_a_scale_reverted_without_restore_is_reported_once_and_backed_off() -> None:
    status = GPUEfficiencyPolicyStatus(reclamations=[scaled_web(NOW - 600)])
    pods, objects = reclaimed_web(2)  # GitOps put replicas back: the record is still on it
    plan = plan_cycle(cluster(pods, objects, status=status))
    assert of(plan.actions, ReclaimOwner) == []  # no second scale
    (event,) = [e for e in of(plan.actions, OwnerEvent) if e.reason == names.EV_RECLAIM_REVERTED]
    assert (event.owner.kind, event.owner.name) == ("Deployment", "web")
    assert "ignore spec.replicas differences" in event.message
    assert "RespectIgnoreDifferences" in event.message
    assert plan.status.reclaims_reverted_total == 1
    (hold,) = plan.status.owner_holds
    assert parse_rfc3339(hold.until) == NOW + 10 * 60  # one reclaim's time: idleFor 5m + warningPeriod 5m
    again = plan_cycle(cluster(pods, objects, status=plan.status, now=NOW + 60))
    assert of(again.actions, ReclaimOwner) == []
    assert not [e for e in of(again.actions, OwnerEvent) if e.reason == names.EV_RECLAIM_REVERTED]
    ended = [h.model_copy(update={"until": format_rfc3339(NOW - 1)}) for h in plan.status.owner_holds]
    after = plan_cycle(cluster(pods, objects, status=plan.status.model_copy(update={"owner_holds": ended})))
    assert [a.owner.name for a in of(after.actions, ReclaimOwner)] == ["web"]


def test_the_back_off_doubles_and_is_capped_at_max_keep() -> None:
    status = GPUEfficiencyPolicyStatus(reclamations=[scaled_web(NOW - 600)])
    pods, objects = reclaimed_web(2)
    first = plan_cycle(cluster(pods, objects, status=status)).status
    second_at = NOW + 3600
    second = first.model_copy(update={"reclamations": [*first.reclamations, scaled_web(second_at - 60)]})
    held = plan_cycle(cluster(pods, objects, status=second, now=second_at)).status
    assert [h.count for h in held.owner_holds] == [2]
    assert parse_rfc3339(held.owner_holds[0].until) == second_at + 20 * 60
    capped = enforce(idle={"max_keep": "15m"})
    short = plan_cycle(cluster(pods, objects, status=second, now=second_at, spec=capped)).status
    assert parse_rfc3339(short.owner_holds[0].until) == second_at + 15 * 60


def test_restore_is_not_a_revert_and_an_annotation_alone_is_not_ours() -> None:
    restored = plan_cycle(
        cluster(
            *reclaimed_web(2, restored=True),
            status=GPUEfficiencyPolicyStatus(reclamations=[scaled_web(NOW - 600)]),
        )
    )
    assert restored.status.reclaims_reverted_total == 0
    forged = plan_cycle(cluster(*reclaimed_web(2)))  # our annotation, no record of ours in status
    assert forged.status.reclaims_reverted_total == 0
    assert [a.owner.name for a in of(forged.actions, ReclaimOwner)] == ["web"]
