"""Owners whose suspend switch belongs to someone else: Kueue's admitted workloads, and RayJobs
KubeRay would refuse to suspend.

Kueue (kubernetes-sigs/kueue v0.19.2) admits a Job, JobSet, RayJob, PyTorchJob, ... through a
``Workload`` object it creates for it: ``pkg/controller/jobframework/reconciler.go`` sets the
Workload's controller reference to the job (``ctrl.SetControllerReference(object, wl, ...)``) and
labels it ``kueue.x-k8s.io/job-uid``. Kueue then owns the job's ``suspend``: it unsuspends the job
on admission and suspends it on eviction, so suspending it ourselves would fight Kueue (it keeps the
quota reserved, and may unsuspend it again). The supported way to stop an admitted workload and
release its quota is the Workload's ``spec.active: false`` (``apis/kueue/v1beta2/workload_types.go``:
"Changing active from true to false will evict any running workloads"): the workload controller
(``pkg/controller/core/workload_controller.go``) sets ``Evicted`` with reason ``Deactivated``, the
job reconciler suspends the job and the quota is released; ``active: true`` again requeues it
(``Requeued``, reason ``Reactivated``) and Kueue admits and unsuspends the job as it did before.

So an owner of a kind Kueue suspends, controlled by a Workload, is reclaimed through that Workload
(action ``Deactivate``); one that carries the ``kueue.x-k8s.io/queue-name`` label but whose Workload
was not read (Kueue's CRD not served, RBAC, not created yet) is never suspended behind Kueue's back.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.engine.model import OwnerKey, OwnerObject, OwnerRef
from gpu_efficiency.engine.reclaim.owners import ACTION_KINDS, Owner

KUEUE_GROUP = "kueue.x-k8s.io"
WORKLOAD = "Workload"

#: (namespace, kind, name) of the object a Workload controls -> that Workload.
WorkloadIndex = Mapping[OwnerKey, OwnerObject]


def kueue_workloads(objects: Mapping[OwnerKey, OwnerObject]) -> WorkloadIndex:
    """Kueue's Workloads, by the object each controls (its controller reference)."""
    index: dict[OwnerKey, OwnerObject] = {}
    for obj in objects.values():
        if obj.ref.kind == WORKLOAD and obj.ref.group == KUEUE_GROUP and obj.controller is not None:
            index[(obj.namespace, obj.controller.kind, obj.controller.name)] = obj
    return index


def admitted_by_kueue(owner: Owner, workloads: WorkloadIndex) -> Owner:
    """The Workload in place of an owner Kueue suspends and admits; the owner unchanged otherwise.
    A Kueue-labelled owner without its Workload read stays itself: a known controller (evicting its
    pods would only have them recreated), which ``refuse_suspend`` leaves to a recommendation."""
    if not owner.known or owner.ref.kind not in ACTION_KINDS[ReclaimAction.SUSPEND]:
        return owner
    found = workloads.get(owner.key)
    if found is not None and found.controller is not None and found.controller.uid == owner.ref.uid:
        return Owner(owner.namespace, found.ref, True, "", found)
    return owner  # a Kueue-labelled one without its Workload read: refuse_suspend recommends


def kueue_admitted(owner: Owner) -> OwnerRef | None:
    """The job a Kueue Workload owner admits (None for any other owner): its user looks there."""
    obj = owner.obj
    if owner.ref.kind != WORKLOAD or owner.ref.group != KUEUE_GROUP or obj is None:
        return None
    return obj.controller


def refuse_suspend(owner: Owner, action: ReclaimAction, why: str) -> tuple[ReclaimAction, str]:
    """Recommend, not Suspend, where the owner's own controller would refuse the suspend (KubeRay
    rejects a suspended RayJob without shutdownAfterJobFinishes, or one in ClusterSelector mode) or
    fight it (Kueue suspends and unsuspends the jobs it queues: without their Workload read, there
    is nothing we may switch)."""
    if action is not ReclaimAction.SUSPEND or owner.obj is None:
        return action, why
    if owner.obj.cannot_suspend:
        return ReclaimAction.RECOMMEND, f"{owner.label} cannot be suspended: {owner.obj.cannot_suspend}"
    if owner.obj.kueue_queue:
        return ReclaimAction.RECOMMEND, (
            f"{owner.label} is queued in Kueue (kueue.x-k8s.io/queue-name={owner.obj.kueue_queue}) but no "
            "Workload controlling it was read: Kueue owns its suspend switch"
        )
    return action, why
