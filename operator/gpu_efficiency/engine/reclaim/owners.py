"""Owner resolution and the reclaim action per owner, from plain data (no I/O).

Evicting a pod whose controller recreates it frees nothing: the GPU goes straight back to the same
idle workload. So an idle pod is traced up its controller chain to its top owner (ReplicaSet ->
Deployment, StatefulSet -> Notebook, Job -> JobSet, ...) and the action is chosen for that owner
(safety rule 10). The chain is followed only through objects the source layer read: a
controller that was not read (a kind without an integration, a CRD not installed) makes the owner
unknown. Nothing we know recreates the pods of an unknown owner, so they are evicted like bare pods
(reclaim.py: at most once before ReclaimIneffective, and after maxKeep where opt-out is allowed):
an owner we cannot act on must not be a way to keep an idle GPU.

Two controllers are deliberately not climbed to: a CronJob (its Job is suspended and the schedule
goes on) and nothing above a ReplicaSet that no Deployment owns (the ReplicaSet is scaled itself).
An owner targeted by a HorizontalPodAutoscaler is scaled to zero like any other: the HPA controller
(kubernetes pkg/controller/podautoscaler/horizontal.go, reconcileAutoscaler, v1.36) does not
rescale a target whose current replicas are 0 unless it scaled it to zero itself (the
HPAScaleToZero ScaledToZero condition): it sets ScalingActive=False, reason ScalingDisabled ("scaling
is disabled since the replica count of the target is zero"), and resumes as soon as the target is
scaled up again, which is what ``gpu-efficiency restore`` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import OwnerActions, ReclaimAction
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.api.suspend_fields import SUSPEND_PATHS, suspend_patch
from gpu_efficiency.engine.model import OwnerKey, OwnerObject, OwnerRef, PodView
from gpu_efficiency.engine.reclaim.reclaimedbyus import reclaimed_by_us

#: Owner kinds with an integration, and the API group each must come from.
OWNER_GROUPS: Mapping[str, str] = {
    "Deployment": "apps",
    "ReplicaSet": "apps",
    "StatefulSet": "apps",
    "Job": "batch",
    "JobSet": "jobset.x-k8s.io",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io",
    "Notebook": "kubeflow.org",
    "InferenceService": "serving.kserve.io",
    "RayCluster": "ray.io",
    "RayJob": "ray.io",
    "PyTorchJob": "kubeflow.org",
    "MPIJob": "kubeflow.org",
    "TFJob": "kubeflow.org",
    "TrainJob": "trainer.kubeflow.org",
}
#: What each owner-level action can be applied to (the rest: Evict or Recommend only).
ACTION_KINDS: Mapping[ReclaimAction, frozenset[str]] = {
    ReclaimAction.SCALE_TO_ZERO: frozenset({"Deployment", "ReplicaSet", "StatefulSet", "LeaderWorkerSet"}),
    ReclaimAction.STOP: frozenset({"Notebook"}),
    ReclaimAction.SUSPEND: frozenset({"Job", "JobSet"})
    | frozenset({"RayCluster", "RayJob", "PyTorchJob", "MPIJob", "TFJob", "TrainJob"}),
    ReclaimAction.DEACTIVATE: frozenset({"Workload"}),  # Kueue's (engine/reclaim/crd_owners.py)
}
BARE = "Pod"
#: A controller above a Job that is left alone: the Job is the owner acted on (its next run starts).
SCHEDULERS: Mapping[str, str] = {"CronJob": "batch"}
_MAX_DEPTH = 8  # controller chains are 2-4 deep; a longer one is a loop in bad data


@dataclass(frozen=True, slots=True)
class Owner:
    """The top owner of a pod (the pod itself when bare)."""

    namespace: str
    ref: OwnerRef
    known: bool  # the kind has an integration and every link of the chain was read
    why: str = ""  # why not known
    obj: OwnerObject | None = None  # None for a bare pod or an owner that was not read
    scheduler: OwnerRef | None = None  # the CronJob that created this Job (left alone)
    scheduler_obj: OwnerObject | None = None  # that CronJob when it was read

    @property
    def key(self) -> OwnerKey:
        return (self.namespace, self.ref.kind, self.ref.name)

    @property
    def label(self) -> str:
        """``deployment/nb``: the KIND/NAME form kubectl and ``gpu-efficiency restore`` take."""
        return f"{self.ref.kind.lower()}/{self.ref.name}"


def resolve_owner(pod: PodView, objects: Mapping[OwnerKey, OwnerObject]) -> Owner:
    """Follow the pod's controller references through ``objects`` to the top owner."""
    ref = pod.controller
    if ref is None:
        if pod.controller_kind is not None:  # a view without the reference itself: nothing to follow
            return Owner(pod.namespace, OwnerRef("", pod.controller_kind, ""), False, "controller not known")
        return Owner(pod.namespace, OwnerRef("v1", BARE, pod.name, pod.uid), True)
    obj: OwnerObject | None = None
    for _ in range(_MAX_DEPTH):
        found = objects.get((pod.namespace, ref.kind, ref.name))
        if found is None or found.ref.group != ref.group or (ref.uid and found.ref.uid != ref.uid):
            what = f"{ref.kind}/{ref.name} ({ref.api_version or 'no apiVersion'})"
            reason = (
                "a controller kind without an integration" if ref.kind not in OWNER_GROUPS else "not found"
            )
            return Owner(pod.namespace, ref, False, f"controller {what} was not read: {reason}", obj)
        obj = found
        above = found.controller
        if above is None:
            break
        if found.ref.kind == "Job" and SCHEDULERS.get(above.kind) == above.group:
            scheduler = objects.get((pod.namespace, above.kind, above.name))
            return Owner(pod.namespace, ref, True, "", obj, above, scheduler)
        ref = above
    else:
        return Owner(pod.namespace, ref, False, "controller chain too deep", obj)
    if OWNER_GROUPS.get(ref.kind) != ref.group:
        return Owner(
            pod.namespace,
            ref,
            False,
            f"top controller {ref.kind} ({ref.api_version}) has no integration",
            obj,
        )
    return Owner(pod.namespace, ref, True, "", obj)


def choose_action(owner: Owner, actions: OwnerActions) -> tuple[ReclaimAction, str]:
    """The policy's action for the owner and, when it is not the kind's own action, why: an unknown
    owner's pods get the bare pods' action (Evict: nothing we know recreates them), or Recommend."""
    if not owner.known:
        why = f"owner {owner.label} cannot be acted on: {owner.why}"
        return actions.for_kind(BARE), why
    action = actions.for_kind(owner.ref.kind)
    if action is ReclaimAction.RECOMMEND:
        return action, f"reclaim.actions.{owner.ref.kind} is Recommend"
    if action is not ReclaimAction.EVICT and owner.ref.kind not in ACTION_KINDS[action]:
        return ReclaimAction.RECOMMEND, f"{action.value} does not apply to a {owner.ref.kind}"
    return action, ""


def in_reclaimed_state(obj: OwnerObject, action: str) -> bool:
    """The object is at 0 replicas, suspended or stopped, as ``action`` left it."""
    in_state = {
        ReclaimAction.SCALE_TO_ZERO.value: obj.replicas == 0,
        ReclaimAction.SUSPEND.value: obj.suspended,
        ReclaimAction.STOP.value: names.KUBEFLOW_STOPPED in obj.annotations,
        ReclaimAction.DEACTIVATE.value: obj.suspended,  # a Workload's spec.active=false
    }
    return in_state.get(action, False)


def already_reclaimed(owner: Owner, records: Iterable[Reclamation]) -> str:
    """The action we reclaimed the owner with, while it is still in that state ('' otherwise).

    Proven by our own status record for the owner's uid (``reclaimed_by_us``), never by the
    ``reclaimed`` annotation alone, which the owner's user can write."""
    obj = owner.obj
    if obj is None:
        return ""
    record = reclaimed_by_us(obj.ref.uid, records)
    if record is None or record.owner != "/".join(owner.key):
        return ""
    return record.action if in_reclaimed_state(obj, record.action) else ""


_VERBS: Mapping[str, str] = {
    "Deployment": "scale it to zero",
    "ReplicaSet": "scale it to zero",
    "StatefulSet": "scale it to zero",
    "LeaderWorkerSet": "scale it to zero",
    "InferenceService": "set its minReplicas to 0 or delete it",
    "Job": "suspend it",
    "JobSet": "suspend it",
    "Notebook": "stop it",
    "RayCluster": "suspend it",
    "RayJob": "suspend it",
    "PyTorchJob": "suspend it",
    "MPIJob": "suspend it",
    "TFJob": "suspend it",
    "TrainJob": "suspend it",
    "Workload": "deactivate it (spec.active=false)",
    BARE: "delete it",
}


def recommendation(owner: Owner, idle: int, total: int) -> str:
    """What the owner's user should do: the pod annotation and ReclaimSkipped event text."""
    if idle < total:
        return f"{idle} of {total} replicas idle: reduce replicas of {owner.label}"
    return f"all {total} GPU pod(s) of {owner.label} idle: {_VERBS.get(owner.ref.kind, 'release its GPUs')}"


_PAST: Mapping[ReclaimAction, str] = {
    ReclaimAction.SCALE_TO_ZERO: "scaled to zero",
    ReclaimAction.STOP: "stopped",
    ReclaimAction.SUSPEND: "suspended",
    ReclaimAction.EVICT: "evicted",
    ReclaimAction.DEACTIVATE: "deactivated",
}


def scheduler_note(owner: Owner) -> str:
    """What happens to the CronJob of a suspended Job (kubernetes pkg/controller/cronjob: a Job that
    is not finished stays in status.active; Forbid starts no run while one is active, Replace deletes
    the active ones at the next run)."""
    cron = owner.scheduler
    if cron is None:
        return ""
    label = f"{cron.kind.lower()}/{cron.name}"
    policy = owner.scheduler_obj.concurrency_policy if owner.scheduler_obj is not None else ""
    if policy == "Forbid":
        return (
            f"{label} is left alone, but its concurrencyPolicy Forbid starts no new run while this "
            f"suspended Job exists: restore or delete {owner.label} to let the next scheduled run start"
        )
    if policy == "Replace":
        return f"{label} is left alone: its next scheduled run will start and replace this suspended Job"
    return f"{label} is left alone: its next scheduled run will start as usual"


def action_words(owner: Owner, action: ReclaimAction) -> str:
    """``deployment/nb will be scaled to zero``: the warning's subject and verb."""
    if owner.ref.kind == BARE:
        return "the pod will be evicted"
    if action is ReclaimAction.EVICT:
        return f"the pods of {owner.label} will be evicted"
    if owner.scheduler is not None:
        return f"{owner.label} (created by {owner.scheduler.kind.lower()}/{owner.scheduler.name}) will be {_PAST.get(action, 'reclaimed')}"
    return f"{owner.label} will be {_PAST.get(action, 'reclaimed')}"


def restore_commands(namespace: str, kind: str, name: str) -> str:
    """The way back, printed in every GPUReclaimed event."""
    label = f"{kind.lower()}/{name}"
    return f"restore with: gpu-efficiency restore {label} -n {namespace} (or: {kubectl_restore(namespace, kind, name)})"


def kubectl_restore(namespace: str, kind: str, name: str) -> str:
    """The equivalent kubectl line (previous replicas read from the owner's annotation)."""
    label = f"{kind.lower()}/{name}"
    drop = " ".join(f"{key}-" for key in names.OWNER_ANNOTATIONS)
    if kind in ACTION_KINDS[ReclaimAction.SCALE_TO_ZERO]:
        first = (
            f"kubectl scale {label} -n {namespace} --replicas=$(kubectl get {label} -n {namespace} "
            f"-o jsonpath='{{.metadata.annotations.gpuefficiency\\.io/previous-replicas}}')"
        )
    elif kind in SUSPEND_PATHS:
        resume = json.dumps({"spec": suspend_patch(kind, False)}, separators=(",", ":"))
        first = f"kubectl patch {label} -n {namespace} --type=merge -p '{resume}'"
    else:
        first = f"kubectl annotate {label} -n {namespace} {names.KUBEFLOW_STOPPED}-"
    return f"{first} && kubectl annotate {label} -n {namespace} {drop}"
