"""Idle GPU reclamation: when a GPU counts as idle, the budgets that bound reclaims, and what is done
to an idle pod's owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Literal, cast

from pydantic import Field

from gpu_efficiency.api.policy.base import Duration, Model


class IdleRule(Model):
    """Idle GPU reclamation: idle-since, then a warning with evict-after, then eviction (Enforce only)."""

    enabled: bool = True
    """Detect idle GPUs at all."""
    activity_below: float = Field(default=0.01, ge=0.0, le=1.0)
    """A GPU is idle when its peak activity (SM active, else GR engine active, else GPU util) over the window is below this."""
    idle_for: Duration = Duration("30m")
    """How long a pod must stay idle before it is warned. The clock starts once a whole window was idle, so the warning comes window + idleFor after the last activity."""
    warning_period: Duration = Duration("15m")
    """Time between the warning (evict-after annotation and event) and the reclaim (eviction, or the owner's scale to zero, suspend or stop); must be above 0s in Enforce."""
    allow_opt_out: bool = False
    """Honour the pod annotation gpuefficiency.io/exempt=true."""
    allow_keep_until: bool = True
    """Honour the pod acknowledgements gpuefficiency.io/keep-for=<duration> and keep-until=<RFC3339>, bounded by maxKeep."""
    max_keep: Duration = Duration("24h")
    """Longest an acknowledgement (keep-for, keep-until) may postpone eviction, counted from when it was first seen."""


class EvictionBudget(Model):
    """Caps that bound the damage of any mistake."""

    max_per_cycle: int = Field(default=5, ge=0, le=10000)
    """Most reclaims (an owner scaled, stopped or suspended, or a pod evicted) in one evaluation cycle."""
    max_per_hour: int = Field(default=20, ge=0, le=100000)
    """Most reclaims in any rolling hour, across restarts (kept in status)."""
    max_per_namespace_per_cycle: int = Field(default=2, ge=0, le=10000)
    """Most reclaims in one namespace in one cycle."""
    min_pod_age: Duration | None = None
    """Pods younger than this are never evicted; default: the metric window (warm-up)."""
    allow_bare_pods: bool = False
    """Evict pods without a controller (nothing recreates them). Off by default."""
    priority_threshold: int = Field(default=1_000_000_000, ge=-2147483648, le=2147483647)
    """Pods with priority at or above this (system-critical: 2000000000) are never evicted."""


class ReclaimAction(StrEnum):
    """What reclaiming an idle owner does (safety rule 10)."""

    SCALE_TO_ZERO = "ScaleToZero"  # replicas 0 through the /scale subresource
    STOP = "Stop"  # Kubeflow Notebook: the kubeflow-resource-stopped annotation
    SUSPEND = "Suspend"  # Job, JobSet: spec.suspend=true
    EVICT = "Evict"  # the pods through the Eviction API (nothing recreates a bare pod)
    DEACTIVATE = "Deactivate"  # a Kueue-admitted owner: its Workload's spec.active=false
    RECOMMEND = "Recommend"  # annotate and emit only


class OwnerActions(Model):
    """The action per owner kind. An owner targeted by a HorizontalPodAutoscaler is scaled like any
    other (the HPA stops at 0 replicas and resumes on restore). Pods whose owner cannot be acted on
    (a controller of another kind, or one that was not read) are evicted like bare pods; an owner only
    partly idle is never acted on: its pods get a recommendation instead."""

    deployment: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SCALE_TO_ZERO, alias="Deployment"
    )
    """Deployments (apps/v1, through their ReplicaSet): scaled to zero through deployments/scale."""
    replica_set: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SCALE_TO_ZERO, alias="ReplicaSet"
    )
    """ReplicaSets (apps/v1) not owned by a Deployment: scaled to zero through replicasets/scale."""
    stateful_set: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SCALE_TO_ZERO, alias="StatefulSet"
    )
    """StatefulSets (apps/v1) not owned by another controller: scaled to zero through statefulsets/scale."""
    job: Literal[ReclaimAction.SUSPEND, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="Job"
    )
    """Jobs (batch/v1) not owned by another controller, or created by a CronJob: suspended
    (spec.suspend=true; not failed). The CronJob is left alone: its next scheduled run starts."""
    job_set: Literal[ReclaimAction.SUSPEND, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="JobSet"
    )
    """JobSets (jobset.x-k8s.io): suspended (spec.suspend=true)."""
    leader_worker_set: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = (
        Field(default=ReclaimAction.RECOMMEND, alias="LeaderWorkerSet")
    )
    """LeaderWorkerSets (leaderworkerset.x-k8s.io): recommend by default; ScaleToZero uses leaderworkersets/scale."""
    notebook: Literal[ReclaimAction.STOP, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.STOP, alias="Notebook"
    )
    """Kubeflow Notebooks (kubeflow.org/v1): stopped with the kubeflow-resource-stopped annotation."""
    inference_service: Literal[ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.RECOMMEND, alias="InferenceService"
    )
    """KServe InferenceServices (serving.kserve.io): recommend by default (their autoscaler owns replicas)."""
    ray_cluster: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="RayCluster"
    )
    """KubeRay RayClusters (ray.io/v1) not owned by a RayJob: suspended (spec.suspend=true; KubeRay
    deletes the head and worker pods and starts them again when resumed)."""
    ray_job: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="RayJob"
    )
    """KubeRay RayJobs (ray.io/v1): suspended (spec.suspend=true; KubeRay deletes the RayJob's
    RayCluster and creates a new one when resumed). Only RayJobs with shutdownAfterJobFinishes=true,
    which KubeRay requires of a suspended RayJob; the others get a recommendation."""
    py_torch_job: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="PyTorchJob"
    )
    """Kubeflow training-operator PyTorchJobs (kubeflow.org/v1): suspended (spec.runPolicy.suspend=true)."""
    mpi_job: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="MPIJob"
    )
    """Kubeflow training-operator MPIJobs (kubeflow.org/v1): suspended (spec.runPolicy.suspend=true)."""
    tf_job: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="TFJob"
    )
    """Kubeflow training-operator TFJobs (kubeflow.org/v1): suspended (spec.runPolicy.suspend=true)."""
    train_job: Literal[ReclaimAction.SUSPEND, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="TrainJob"
    )
    """Kubeflow Trainer TrainJobs (trainer.kubeflow.org/v1alpha1, through their JobSet): suspended
    (spec.suspend=true)."""
    workload: Literal[ReclaimAction.DEACTIVATE, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.DEACTIVATE, alias="Workload"
    )
    """Owners admitted by Kueue (a kueue.x-k8s.io Workload controlled by the owner): Kueue owns their
    suspend switch, so the Workload is deactivated instead (spec.active=false: Kueue evicts it,
    suspends the owner and releases its quota). Recommend leaves them alone. A Kueue-labelled owner
    whose Workload was not read is never suspended behind Kueue's back: it gets a recommendation."""
    pod: Literal[ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.EVICT, alias="Pod"
    )
    """Bare pods, and pods whose owner cannot be acted on: evicted (bare ones only when
    eviction.allowBarePods is true)."""

    def for_kind(self, kind: str) -> ReclaimAction:
        """The action for an owner kind; Recommend for kinds without an integration."""
        field = _FIELD_OF_KIND.get(kind)
        return ReclaimAction.RECOMMEND if field is None else cast(ReclaimAction, getattr(self, field))


#: Owner kind (each field's alias) -> its ``OwnerActions`` field: read once per pod each cycle
#: (8,000 at 1,000 nodes), where building the whole kind table each time cost ~1.5 µs a call.
_FIELD_OF_KIND: Mapping[str, str] = {
    info.alias: name for name, info in OwnerActions.model_fields.items() if info.alias
}


class ReclaimWhen(StrEnum):
    """When warned-and-due idle owners are acted on."""

    ALWAYS = "Always"  # as soon as their warning is over
    ON_PRESSURE = "OnPressure"  # only while GPU pods wait unschedulable, and only enough to fit them


class ReclaimRule(Model):
    """How idle GPUs are given back: act on each idle pod's top owner, so the GPU stays free."""

    actions: OwnerActions = Field(default_factory=OwnerActions)
    """The action per owner kind (Enforce mode only; Observe shows what would be done)."""
    reclaim_when: ReclaimWhen = ReclaimWhen.ALWAYS
    """Always: an idle owner is reclaimed once its warning is over. OnPressure: warnings still go out
    on time, but a due owner is reclaimed only while a GPU pod is Pending as unschedulable for lack
    of nvidia.com/gpu, and only the fewest owners whose GPUs make that pod fit (its GPU request,
    nodeSelector, required node affinity and tolerations against each node's allocatable GPUs)."""
