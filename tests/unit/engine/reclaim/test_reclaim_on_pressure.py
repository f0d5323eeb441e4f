"""reclaimWhen OnPressure through the planner, and the reclamation records that prove the GPUs were used."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, enforce, gpu, no_faults, snapshot  # noqa: F401 (fixture)
from tests.unit.engine.owner_builders import (
    chain,
    due_annotations,
    obj,
    our_record,
    owned,
    with_owners,
    with_records,
)

from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    NodeView,
    OwnerObject,
    PendingPod,
    PodView,
    ReclaimOwner,
    Snapshot,
    Verdict,
)
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import evaluate
from gpu_efficiency.engine.reclaim.reclaim import group_owners
from gpu_efficiency.engine.reclaim.reclaimproof import accepted, advance, newly_running

pytestmark = pytest.mark.usefixtures("no_faults")
INSUFFICIENT = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def waiting(name: str, gpus: int) -> PendingPod:
    return PendingPod(
        "batch", name, f"uid-{name}", gpus, 0, NOW - 30, {}, (), (), "Unschedulable", INSUFFICIENT
    )


def full_node(idle_owners: int, **spec: Any) -> tuple[list[PodView], list[OwnerObject], Snapshot]:
    """A node of ``idle_owners`` one-GPU Deployments, all idle, warned and due."""
    pods, objects = [], []
    for i in range(idle_owners):
        pods.append(owned(f"nb{i}-0", ("ReplicaSet", f"nb{i}-5d9"), annotations=due_annotations(30 - i)))
        objects += chain(("ReplicaSet", f"nb{i}-5d9"), ("Deployment", f"nb{i}"), replicas=1)
    node = NodeView("node-0", {}, {}, (), (), idle_owners)
    gpus = [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    snap = snapshot(gpus, pods, enforce(**spec), nodes=[node])
    return pods, objects, with_owners(snap, objects)


def reclaimed(snap: Snapshot) -> list[str]:
    return [a.owner.name for a in evaluate(snap).plan.actions if isinstance(a, ReclaimOwner)]


ON_PRESSURE = {"reclaim": {"reclaim_when": "OnPressure"}}


def test_on_pressure_acts_on_nothing_while_nothing_waits_and_keeps_the_warnings() -> None:
    _, _, snap = full_node(2, **ON_PRESSURE)
    plan = evaluate(snap).plan
    assert reclaimed(snap) == []
    assert not any(names.EVICT_AFTER in (getattr(a, "annotations", {}) or {}) for a in plan.actions)
    assert any("reclaimWhen OnPressure and no GPU pod waiting" in n for n in plan.notes)
    assert plan.status.warned_pods == 2
    _, _, always = full_node(2)
    assert reclaimed(always) == ["nb0", "nb1"]  # Always (the default) reclaims both


def test_on_pressure_reclaims_exactly_enough_for_the_waiting_pod() -> None:
    _, _, snap = full_node(3, **ON_PRESSURE)
    assert reclaimed(replace(snap, pending=(waiting("one", 1),))) == ["nb0"]  # the longest idle
    assert reclaimed(replace(snap, pending=(waiting("two", 2),))) == ["nb0", "nb1"]
    plan = evaluate(replace(snap, pending=(waiting("two", 2),))).plan
    assert (plan.status.pending_gpu_demand.pods, plan.status.pending_gpu_demand.gpus) == (1, 2)
    drafts = [record for _, record in plan.reclamations]
    assert [(r.owner, r.nodes, r.gpus, r.waiting_pods) for r in drafts] == [
        ("team-a/Deployment/nb0", ["node-0"], 1, ["batch/two"]),
        ("team-a/Deployment/nb1", ["node-0"], 1, ["batch/two"]),
    ]
    # the proof restore and the engine rely on: the owner's uid and the replicas it had
    assert [(r.uid, r.replicas) for r in drafts] == [("uid-Deployment-nb0", 1), ("uid-Deployment-nb1", 1)]


def test_every_reclamation_in_force_is_kept_so_that_it_stays_restorable() -> None:
    """More than MAX_RECORDS owners reclaimed and still at zero: none loses its record (restore
    needs it); of the ones that ended only the last MAX_RECORDS are kept."""
    in_force = [record(owner=f"team-a/Deployment/nb{i}", uid=f"u{i}") for i in range(12)]
    ended = [record(owner=f"team-a/Deployment/old{i}", returned=False) for i in range(12)]
    kept = accepted([*ended, *in_force[:6]], in_force[6:])
    assert [r.uid for r in kept if r.returned] == [f"u{i}" for i in range(12)]
    assert len([r for r in kept if not r.returned]) == 10


def test_on_pressure_does_not_reclaim_again_while_a_reclaimed_owner_is_freeing_its_gpu() -> None:
    pods, objects, snap = full_node(2, **ON_PRESSURE)
    done = {names.RECLAIMED: "ScaleToZero"}
    objects = [replace(o, replicas=0, annotations=done) if o.ref.name == "nb0" else o for o in objects]
    going = [replace(p, deleting=True) if p.name == "nb0-0" else p for p in pods]
    snap = with_owners(replace(snap, pods=tuple(going), pending=(waiting("one", 1),)), objects)
    assert reclaimed(with_records(snap, our_record("Deployment", "nb0"))) == []  # on its way to the pod


def test_owners_are_decided_where_a_pod_is_idle_or_our_record_says_reclaimed() -> None:
    """``OwnerPlan``: an owner without an Idle pod is not decided (nothing reads it), except one our
    status records as reclaimed, whose terminating pods free GPUs for the fit check."""
    pods, objects, snap = full_node(3, **ON_PRESSURE)
    done = {names.RECLAIMED: "ScaleToZero"}
    objects = [replace(o, replicas=0, annotations=done) if o.ref.name == "nb0" else o for o in objects]
    going = [replace(p, deleting=True) if p.name == "nb0-0" else p for p in pods]
    snap = with_records(
        with_owners(replace(snap, pods=tuple(going)), objects), our_record("Deployment", "nb0")
    )
    verdicts = {("team-a", "nb2-0"): Verdict.IDLE, ("team-a", "nb1-0"): Verdict.EFFICIENT}
    plan = group_owners(snap, snap.pods, verdicts, cycle_params(snap.policy))
    assert sorted(key[2] for key in plan.groups) == ["nb0", "nb2"]
    assert plan.groups[("team-a", "Deployment", "nb0")].reclaimed
    assert plan.of_pod[("team-a", "nb2-0")].idle == 1
    assert ("team-a", "nb1-0") not in plan.of_pod


def test_a_forged_reclaimed_annotation_frees_no_gpu_for_the_fit_check() -> None:
    """Issue 31.3: a tenant's decoy Deployment at 0 replicas annotated reclaimed, with a busy pod
    pointed at it, must not make the waiting pod 'fit in free GPUs': the due idle owner is reclaimed."""
    pods, objects, snap = full_node(1, **ON_PRESSURE)
    node = replace(snap.nodes[0], gpu_capacity=2)
    decoy_pod = owned("squatter", ("Deployment", "decoy"), namespace="team-b", node="node-0")
    decoy = obj("Deployment", "decoy", "team-b", replicas=0, annotations={names.RECLAIMED: "ScaleToZero"})
    busy = gpu("GPU-squatter", b.compute_bound(), ("team-b", "squatter"))
    snap = replace(
        snap, pods=(*pods, decoy_pod), gpus=(*snap.gpus, busy), nodes=(node,), pending=(waiting("one", 1),)
    )
    snap = with_owners(snap, [*objects, decoy])
    assert reclaimed(snap) == ["nb0"]
    plan = evaluate(snap).plan
    assert not any("fits in free GPUs" in n for n in plan.notes)
    # our own record of the decoy's uid, but its pod not terminating: still frees nothing
    assert reclaimed(with_records(snap, our_record("Deployment", "decoy", "team-b"))) == ["nb0"]


def test_on_pressure_respects_the_budgets_and_a_pod_that_cannot_fit() -> None:
    _, _, snap = full_node(3, **ON_PRESSURE, eviction={"max_per_cycle": 1})
    assert reclaimed(replace(snap, pending=(waiting("two", 2),))) == ["nb0"]
    assert reclaimed(replace(snap, pending=(waiting("huge", 4),))) == []


def record(**fields: Any) -> Reclamation:
    base: dict[str, Any] = {
        "owner": "team-a/Deployment/nb0", "action": "ScaleToZero", "time": format_rfc3339(NOW - 600),
        "nodes": ["node-0"], "gpus": 2, "controllers": ["ReplicaSet/nb0-5d9"], "waiting_pods": ["batch/two"],
    }  # fmt: skip
    return Reclamation.model_validate(base | fields)


def test_gpu_hours_are_counted_while_the_owner_stays_reclaimed_and_stop_when_it_is_back() -> None:
    records, hours = advance([record()], [], None, NOW, 0.5)
    assert hours == pytest.approx(1.0)
    assert records[0].gpu_hours_returned == pytest.approx(1.0)
    old = owned("nb0-0", ("ReplicaSet", "nb0-5d9"), start_time=NOW - 7200, deleting=True)
    assert advance(records, [old], None, NOW, 0.5)[1] == pytest.approx(1.0)  # its old pod going
    back = owned("nb0-x", ("ReplicaSet", "nb0-5d9"), start_time=None)
    records, hours = advance(records, [back], None, NOW, 0.5)
    assert hours == 0.0
    assert not records[0].returned
    assert advance(records, [], None, NOW, 0.5)[1] == 0.0  # it stays ended
    restored = obj("Deployment", "nb0", replicas=1)
    assert advance([record()], [], {("team-a", "Deployment", "nb0"): restored}, NOW, 0.5)[1] == 0.0
    still = obj("Deployment", "nb0", replicas=0, annotations={names.RECLAIMED: "ScaleToZero"})
    assert advance([record()], [], {("team-a", "Deployment", "nb0"): still}, NOW, 0.5)[1] == 1.0


def test_the_first_waiting_pod_running_on_a_freed_node_gives_the_time_to_running() -> None:
    elsewhere = b.pod("two", "batch", node="node-9", start_time=NOW - 60)
    stranger = b.pod("other", "batch", node="node-0", start_time=NOW - 500)
    records, _ = advance([record()], [elsewhere, stranger], None, NOW, 0.0)
    assert records[0].seconds_to_running is None
    arrived = b.pod("two", "batch", node="node-0", start_time=NOW - 480)
    after, _ = advance(records, [arrived], None, NOW, 0.0)
    assert (after[0].running_pod, after[0].seconds_to_running) == ("batch/two", 120.0)
    assert newly_running(records, after) == [120.0]
    assert newly_running(after, advance(after, [arrived], None, NOW, 0.0)[0]) == []  # observed once


def test_the_status_carries_the_records_forward_with_the_gpu_hours_returned() -> None:
    _, _, snap = full_node(1)
    previous = GPUEfficiencyPolicyStatus(
        last_evaluation_time=format_rfc3339(NOW - 60), reclamations=[record()], gpu_hours_returned=1.0
    )
    status = evaluate(replace(snap, status=previous, owners=None)).plan.status  # no owner read this cycle
    assert status.gpu_hours_returned == pytest.approx(1.0 + 2 * 60 / 3600)
    assert status.reclamations[0].gpu_hours_returned == pytest.approx(2 * 60 / 3600)


def test_owners_that_could_not_be_read_do_not_end_the_records_restore_relies_on() -> None:
    """A failed owner read leaves the snapshot an empty owner index with owners_error: that says
    nothing about the owners, so a record in force must not be taken for one whose owner is gone
    (restore would then refuse a reclaimed owner)."""
    _, _, snap = full_node(1)
    previous = GPUEfficiencyPolicyStatus(
        last_evaluation_time=format_rfc3339(NOW - 60), reclamations=[record()]
    )
    unread = replace(snap, status=previous, owners={}, owners_error="listing deployments: HTTP 503")
    status = evaluate(unread).plan.status
    assert [r.returned for r in status.reclamations] == [True]
    gone = replace(snap, status=previous, owners={}, owners_error="")  # read, and it is not there
    assert [r.returned for r in evaluate(gone).plan.status.reclamations] == [False]
