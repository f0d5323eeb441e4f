"""KubeRay, Kubeflow training and Kueue owners in the planner: each kind its action, Kueue's
admitted jobs reclaimed through their Workload (never suspended behind Kueue's back), RayJobs
KubeRay would refuse to suspend left to a recommendation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine.builders import enforce, no_faults, pod  # noqa: F401 (fixture)
from tests.unit.engine.owner_builders import due_annotations
from tests.unit.engine.reclaim.test_reclaim import cluster, evictions, reclaims

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import OwnerActions, ReclaimAction
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.engine.model import OwnerObject, OwnerRef, ReclaimOwner
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.owners import kubectl_restore

pytestmark = pytest.mark.usefixtures("no_faults")

API = {
    "Job": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "RayCluster": "ray.io/v1",
    "RayJob": "ray.io/v1",
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v1",
    "TFJob": "kubeflow.org/v1",
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "Workload": "kueue.x-k8s.io/v1beta2",
}


def ref(kind: str, name: str) -> OwnerRef:
    return OwnerRef(API[kind], kind, name, f"uid-{kind}-{name}")


def chain(*links: tuple[str, str], **top: Any) -> list[OwnerObject]:
    """Objects from the pod's controller up, the fields in ``top`` on the last."""
    out = []
    for i, (kind, name) in enumerate(links):
        above = ref(*links[i + 1]) if i + 1 < len(links) else None
        view = OwnerObject("team-a", ref(kind, name), above, {})
        out.append(replace(view, **top) if i + 1 == len(links) else view)
    return out


def workload(name: str, of: tuple[str, str], *, uid: str | None = None, **fields: Any) -> OwnerObject:
    """A Kueue Workload controlling ``of`` (as jobframework's SetControllerReference writes it)."""
    target = ref(*of)
    if uid is not None:
        target = replace(target, uid=uid)
    return replace(OwnerObject("team-a", ref("Workload", name), target, {}), **fields)


def owned(name: str, controller: tuple[str, str]) -> Any:
    """A due idle pod controlled by ``controller``."""
    view = pod(name, controller_kind=controller[0], annotations=due_annotations())
    return replace(view, controller=ref(*controller))


def plan_for(controller: tuple[str, str], objects: list[OwnerObject], spec: Any = None) -> Any:
    pods = [owned("p", controller)]
    return plan_cycle(cluster(pods, objects, spec=spec))


@pytest.mark.parametrize(
    ("controller", "links", "expected"),
    [
        (("RayCluster", "rc"), [("RayCluster", "rc")], "Suspend RayCluster/rc"),
        (("PyTorchJob", "pt"), [("PyTorchJob", "pt")], "Suspend PyTorchJob/pt"),
        (("MPIJob", "mpi"), [("MPIJob", "mpi")], "Suspend MPIJob/mpi"),
        (("TFJob", "tf"), [("TFJob", "tf")], "Suspend TFJob/tf"),
        (
            ("Job", "tj-node-0"),
            [("Job", "tj-node-0"), ("JobSet", "tj"), ("TrainJob", "tj")],
            "Suspend TrainJob/tj",
        ),
    ],
)
def test_each_kuberay_and_kubeflow_kind_is_suspended_at_its_top(
    controller: tuple[str, str], links: list[tuple[str, str]], expected: str
) -> None:
    plan = plan_for(controller, chain(*links))
    assert reclaims(plan.actions) == [expected]
    assert evictions(plan.actions) == []


def test_a_rayjob_is_suspended_only_where_kuberay_allows_it() -> None:
    links = [("RayCluster", "rj-raycluster-x"), ("RayJob", "rj")]
    assert reclaims(plan_for(links[0], chain(*links)).actions) == ["Suspend RayJob/rj"]
    refused = chain(
        *links, cannot_suspend="KubeRay suspends a RayJob only with spec.shutdownAfterJobFinishes=true"
    )
    plan = plan_for(links[0], refused)
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    assert any("rayjob/rj cannot be suspended: KubeRay suspends" in n for n in plan.notes), plan.notes


def test_a_kueue_admitted_job_is_deactivated_through_its_workload_not_suspended() -> None:
    objects = [*chain(("Job", "train"), kueue_queue="team-q"), workload("job-train-3f2a1", ("Job", "train"))]
    plan = plan_for(("Job", "train"), objects)
    assert reclaims(plan.actions) == ["Deactivate Workload/job-train-3f2a1"]
    action = next(a for a in plan.actions if isinstance(a, ReclaimOwner))
    assert action.owner == ref("Workload", "job-train-3f2a1")
    assert action.pods == (("p", "uid-team-a-p"),)
    assert action.admitted == ref("Job", "train")  # its GPUReclaimed event, where the job's user looks
    assert action.reason.endswith(
        "deactivated to free the GPU by policy test-policy (the Kueue Workload of job/train)"
    )


@pytest.mark.parametrize(
    ("controller", "links"),
    [
        (("Job", "w-0"), [("Job", "w-0"), ("JobSet", "w")]),
        (("RayCluster", "rj-rc"), [("RayCluster", "rj-rc"), ("RayJob", "rj")]),
        (("PyTorchJob", "pt"), [("PyTorchJob", "pt")]),
        (("Job", "tj-0"), [("Job", "tj-0"), ("JobSet", "tj"), ("TrainJob", "tj")]),
    ],
)
def test_every_kind_kueue_admits_goes_through_its_workload(
    controller: tuple[str, str], links: list[tuple[str, str]]
) -> None:
    objects = [*chain(*links), workload("wl", links[-1])]
    assert reclaims(plan_for(controller, objects).actions) == ["Deactivate Workload/wl"]


def test_a_kueue_labelled_job_without_its_workload_read_is_never_suspended() -> None:
    plan = plan_for(("Job", "train"), chain(("Job", "train"), kueue_queue="team-q"))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    assert any("kueue.x-k8s.io/queue-name=team-q" in n and "Kueue owns" in n for n in plan.notes), plan.notes


def test_a_workload_of_a_same_named_predecessor_is_not_the_jobs() -> None:
    """A stale Workload (its controller uid another Job's) is not deactivated for this Job."""
    objects = [*chain(("Job", "train"), kueue_queue="q"), workload("old", ("Job", "train"), uid="uid-gone")]
    plan = plan_for(("Job", "train"), objects)
    assert reclaims(plan.actions) == []


def test_a_deployment_in_a_kueue_queue_is_still_scaled() -> None:
    """Kueue's pod integration gates a Deployment's pods, it does not own a suspend switch there:
    scaling to zero is not behind its back."""
    rs_ref = OwnerRef("apps/v1", "ReplicaSet", "d-1", "uid-rs")
    pods = [replace(pod("d-0", annotations=due_annotations()), controller=rs_ref)]
    rs = OwnerObject("team-a", rs_ref, OwnerRef("apps/v1", "Deployment", "d", "uid-d"), {})
    dep = OwnerObject("team-a", OwnerRef("apps/v1", "Deployment", "d", "uid-d"), None, {}, 1, kueue_queue="q")
    assert reclaims(plan_cycle(cluster(pods, [rs, dep])).actions) == ["ScaleToZero Deployment/d"]


def test_a_deactivated_workload_is_not_deactivated_again() -> None:
    """Deactivated by this policy (its status record for the Workload's uid): left as it is."""
    done = workload(
        "wl", ("Job", "train"), suspended=True, annotations={names.RECLAIMED: ReclaimAction.DEACTIVATE.value}
    )
    record = Reclamation(
        owner="team-a/Workload/wl", action="Deactivate", time="2026-01-01T00:00:00Z", uid=done.ref.uid
    )
    snapshot = cluster([owned("p", ("Job", "train"))], [*chain(("Job", "train")), done])
    plan = plan_cycle(replace(snapshot, status=GPUEfficiencyPolicyStatus(reclamations=[record])))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    assert any("already reclaimed (Deactivate)" in n for n in plan.notes), plan.notes


def test_the_policy_may_leave_kueue_and_kuberay_owners_to_recommendations() -> None:
    spec = enforce(reclaim={"actions": {"Workload": "Recommend", "RayCluster": "Recommend"}})
    objects = [*chain(("Job", "train")), workload("wl", ("Job", "train"))]
    assert reclaims(plan_for(("Job", "train"), objects, spec).actions) == []
    assert reclaims(plan_for(("RayCluster", "rc"), chain(("RayCluster", "rc")), spec).actions) == []


def test_defaults_and_what_each_kind_accepts() -> None:
    actions = OwnerActions()
    defaults = {
        k: actions.for_kind(k) for k in ("RayCluster", "RayJob", "PyTorchJob", "MPIJob", "TFJob", "TrainJob")
    }
    assert set(defaults.values()) == {ReclaimAction.SUSPEND}
    assert actions.for_kind("Workload") is ReclaimAction.DEACTIVATE
    with pytest.raises(ValueError, match="RayCluster"):
        OwnerActions.model_validate({"RayCluster": "Evict"})  # KubeRay would recreate the pod
    with pytest.raises(ValueError, match="Workload"):
        OwnerActions.model_validate({"Workload": "Suspend"})  # Kueue owns suspend


def test_the_kubectl_way_back_uses_each_kinds_own_switch() -> None:
    assert '-p \'{"spec":{"runPolicy":{"suspend":false}}}\'' in kubectl_restore("ml", "PyTorchJob", "pt")
    assert 'kubectl patch workload/wl -n ml --type=merge -p \'{"spec":{"active":true}}\'' in kubectl_restore(
        "ml", "Workload", "wl"
    )
    assert '-p \'{"spec":{"suspend":false}}\'' in kubectl_restore("ml", "Job", "j")
