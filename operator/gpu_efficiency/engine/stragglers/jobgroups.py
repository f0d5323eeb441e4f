"""Job groups: the GPU pods that form one job, so their GPUs can be compared with each other.

A pod belongs to the first group that names it: a label the policy names (``stragglers.groupBy``),
then the well-known labels of the job controllers (JobSet before Job: a JobSet's pods also carry
their child Job's name), then the pod's controller when it is a job kind (a Kubeflow PyTorchJob or
MPIJob, a RayCluster, a Job). The group's owner, for its events, is the pod's top owner when the
owners were read (``engine/reclaim/owners.py``), else the controller when it is the group's own kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.engine.model import OwnerKey, OwnerObject, OwnerRef, PodView
from gpu_efficiency.engine.reclaim.owners import resolve_owner

#: (label key, the owner kind it names), tried in this order after the policy's ``groupBy`` labels.
GROUP_LABELS: tuple[tuple[str, str], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("training.kubeflow.org/job-name", ""),  # PyTorchJob, MPIJob, TFJob...: the kind is the controller's
    ("ray.io/cluster", "RayCluster"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),  # the label's name before Kubernetes 1.27
)
#: Controller kinds that are one job whose pods work in step.
JOB_KINDS = frozenset(
    {
        "Job",
        "JobSet",
        "LeaderWorkerSet",
        "PyTorchJob",
        "MPIJob",
        "TFJob",
        "XGBoostJob",
        "RayCluster",
        "RayJob",
    }
)


@dataclass(frozen=True, slots=True)
class JobGroup:
    namespace: str
    name: str  # "jobset/train" or "label team/run=7": the metric's group label and the messages' name
    owner: OwnerRef | None  # where the group's event goes (None: no object known to carry it)
    pods: tuple[PodView, ...]


def _group_of(pod: PodView, group_by: Sequence[str]) -> tuple[str, str] | None:
    """(group name, owner kind or '') of one pod, or None when it belongs to no job."""
    labels = pod.labels
    for key in group_by:
        value = labels.get(key)
        if value:
            return f"label {key}={value}", ""
    controller = pod.controller
    for key, kind in GROUP_LABELS:
        value = labels.get(key)
        if value:
            if not kind and controller is not None and controller.kind in JOB_KINDS:
                kind = controller.kind
            return f"{(kind or 'job').lower()}/{value}", kind
    if controller is not None and controller.kind in JOB_KINDS:
        return f"{controller.kind.lower()}/{controller.name}", controller.kind
    return None


def _owner(
    pod: PodView, name: str, kind: str, owners: Mapping[OwnerKey, OwnerObject] | None
) -> OwnerRef | None:
    if owners is not None:
        top = resolve_owner(pod, owners)
        if top.known and top.ref.kind != "Pod" and f"{top.ref.kind.lower()}/{top.ref.name}" == name:
            return top.ref
    controller = pod.controller
    if controller is not None and controller.kind == kind and name.endswith(f"/{controller.name}"):
        return controller
    return None


def job_groups(
    pods: Sequence[PodView],
    group_by: Sequence[str] = (),
    owners: Mapping[OwnerKey, OwnerObject] | None = None,
) -> list[JobGroup]:
    """The job groups of these pods (GPU pods only; namespaces never mix), in a stable order."""
    members: dict[tuple[str, str], list[PodView]] = {}
    kinds: dict[tuple[str, str], str] = {}
    for pod in pods:
        if pod.gpu_request <= 0:
            continue
        found = _group_of(pod, group_by)
        if found is None:
            continue
        key = (pod.namespace, found[0])
        members.setdefault(key, []).append(pod)
        kinds.setdefault(key, found[1])
    groups = []
    for (namespace, name), group_pods in sorted(members.items()):
        owner = None
        for pod in group_pods:
            owner = _owner(pod, name, kinds[(namespace, name)], owners)
            if owner is not None:
                break
        groups.append(JobGroup(namespace, name, owner, tuple(group_pods)))
    return groups
