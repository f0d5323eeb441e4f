"""Where each suspendable owner kind keeps its suspend switch, read by the owner source, written by
the actuator and by ``restore``: one table, so a kind cannot be read at one path and written at
another.

Upstream, at the versions checked:

* Job (batch/v1), JobSet (jobset.x-k8s.io/v1alpha2): ``spec.suspend``.
* RayCluster, RayJob (ray.io/v1, ray-project/kuberay v1.7.0 ``ray-operator/apis/ray/v1/``):
  ``spec.suspend``. A suspended RayCluster has its head and worker pods deleted (conditions
  ``RayClusterSuspending`` then ``RayClusterSuspended``); a suspended RayJob has its RayCluster
  deleted and a new one created when resumed.
* PyTorchJob, MPIJob, TFJob (kubeflow.org/v1, kubeflow/training-operator v1.9.0
  ``pkg/apis/kubeflow.org/v1/common_types.go``): ``spec.runPolicy.suspend``; suspending deletes the
  job's active pods, and a resumed job starts them again.
* TrainJob (trainer.kubeflow.org/v1alpha1, kubeflow/trainer ``pkg/apis/trainer/v1alpha1/
  trainjob_types.go``): ``spec.suspend``, passed down to the JobSet it owns.
* Kueue's Workload (kueue.x-k8s.io, kubernetes-sigs/kueue v0.19.2 ``apis/kueue/v1beta2/
  workload_types.go``): ``spec.active``, the other way round (false stops it): "Changing active
  from true to false will evict any running workloads".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: kind -> the path of its suspend switch under ``spec``.
SUSPEND_PATHS: Mapping[str, tuple[str, ...]] = {
    "Job": ("suspend",),
    "JobSet": ("suspend",),
    "RayCluster": ("suspend",),
    "RayJob": ("suspend",),
    "PyTorchJob": ("runPolicy", "suspend"),
    "MPIJob": ("runPolicy", "suspend"),
    "TFJob": ("runPolicy", "suspend"),
    "TrainJob": ("suspend",),
    "Workload": ("active",),
}
#: Kinds whose switch says "running" rather than "suspended".
INVERTED = frozenset({"Workload"})


def is_suspended(kind: str, spec: Mapping[str, Any]) -> bool:
    """True only when the switch is explicitly in its stopped position (absent means running)."""
    path = SUSPEND_PATHS.get(kind, ("suspend",))
    value: Any = spec
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value is False if kind in INVERTED else value is True


def suspend_patch(kind: str, suspend: bool) -> dict[str, Any]:
    """The ``spec`` of a merge patch that suspends (``suspend=True``) or resumes the kind."""
    path = SUSPEND_PATHS[kind]
    value: Any = (not suspend) if kind in INVERTED else suspend
    for key in reversed(path):
        value = {key: value}
    patch: dict[str, Any] = value
    return patch


def spec_field(kind: str) -> str:
    """``spec.runPolicy.suspend``: the field named in messages and kubectl lines."""
    return ".".join(("spec", *SUSPEND_PATHS[kind]))
