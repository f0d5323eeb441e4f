"""The owner kinds of KubeRay, Kubeflow training and Kueue, and what their objects say about who
may suspend them. Each is read only where discovery finds its CRD served (sources/kube/owners.py).

Owner chains, as the upstream controllers write them (each link a controller ownerReference):

* KubeRay (ray-project/kuberay v1.7.0): pod -> RayCluster; a RayJob's RayCluster -> RayJob.
* Kubeflow training-operator v1 (kubeflow/training-operator v1.9.0): pod -> PyTorchJob / MPIJob / TFJob.
* Kubeflow Trainer v2 (kubeflow/trainer ``pkg/runtime/framework/plugins/jobset``): pod -> Job ->
  JobSet -> TrainJob.
* Kueue (kubernetes-sigs/kueue v0.19.2 ``pkg/controller/jobframework/reconciler.go``): the other way
  round, Workload -> the job it admits. Workloads are served as kueue.x-k8s.io/v1beta2 since Kueue
  v0.15 and as v1beta1 before (and beside it): the first version served is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: (kind, group, version, plural) of each kind, in the order they are tried.
CRD_OWNER_KINDS: tuple[tuple[str, str, str, str], ...] = (
    ("RayCluster", "ray.io", "v1", "rayclusters"),
    ("RayJob", "ray.io", "v1", "rayjobs"),
    ("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
    ("MPIJob", "kubeflow.org", "v1", "mpijobs"),
    ("TFJob", "kubeflow.org", "v1", "tfjobs"),
    ("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    ("Workload", "kueue.x-k8s.io", "v1beta2", "workloads"),
    ("Workload", "kueue.x-k8s.io", "v1beta1", "workloads"),
)
#: Kueue's queue label (pkg/controller/constants: QueueLabel); older Kueue also read it as an annotation.
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"


def kueue_queue(meta: Mapping[str, Any]) -> str:
    """The Kueue LocalQueue an object was submitted to ('' when none)."""
    for where in ("labels", "annotations"):
        value = (meta.get(where) or {}).get(KUEUE_QUEUE_NAME)
        if isinstance(value, str) and value:
            return value
    return ""


def cannot_suspend(kind: str, spec: Mapping[str, Any]) -> str:
    """Why the kind's own controller would reject ``suspend: true`` ('' when it would not).

    KubeRay's ValidateRayJobSpec (ray-operator/controllers/ray/utils/validation.go) fails a RayJob
    with suspend=true unless shutdownAfterJobFinishes is true, and in ClusterSelector mode (a
    RayCluster it does not own): suspending those would break the RayJob, not free its GPUs."""
    if kind != "RayJob":
        return ""
    if spec.get("clusterSelector"):
        return (
            "it runs on an existing RayCluster (clusterSelector), which KubeRay does not suspend for a RayJob"
        )
    if spec.get("shutdownAfterJobFinishes") is not True:
        return "KubeRay suspends a RayJob only with spec.shutdownAfterJobFinishes=true"
    return ""
