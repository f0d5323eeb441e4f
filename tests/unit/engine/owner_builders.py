"""Plain-data owners for the owner-aware reclamation tests: controller chains and their pods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_efficiency.api import names
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import OwnerKey, OwnerObject, OwnerRef, PodView, Snapshot
from tests.unit.engine.builders import NOW, pod

API = {
    "ReplicaSet": "apps/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "Notebook": "kubeflow.org/v1",
    "InferenceService": "serving.kserve.io/v1beta1",
}


def ref(kind: str, name: str) -> OwnerRef:
    return OwnerRef(API.get(kind, "example.com/v1"), kind, name, f"uid-{kind}-{name}")


def obj(
    kind: str,
    name: str,
    namespace: str = "team-a",
    *,
    controller: OwnerRef | None = None,
    replicas: int | None = 1,
    annotations: Mapping[str, str] | None = None,
    suspended: bool = False,
) -> OwnerObject:
    return OwnerObject(namespace, ref(kind, name), controller, dict(annotations or {}), replicas, suspended)


def chain(*links: tuple[str, str], namespace: str = "team-a", **top: Any) -> list[OwnerObject]:
    """Objects from the pod's controller up: ``chain(("ReplicaSet", "nb-1"), ("Deployment", "nb"))``."""
    out = []
    for i, (kind, name) in enumerate(links):
        above = ref(*links[i + 1]) if i + 1 < len(links) else None
        extra = top if i + 1 == len(links) else {}
        out.append(obj(kind, name, namespace, controller=above, **extra))
    return out


def owned(name: str, controller: tuple[str, str] | None, namespace: str = "team-a", **fields: Any) -> PodView:
    """A pod whose controller is ``(kind, name)`` (None: bare)."""
    kind = controller[0] if controller else None
    view = pod(name, namespace, controller_kind=kind, **fields)
    return replace(view, controller=ref(*controller) if controller else None)


def due_annotations(idle_minutes: int = 30) -> dict[str, str]:
    return {
        names.IDLE_SINCE: format_rfc3339(NOW - idle_minutes * 60),
        names.EVICT_AFTER: format_rfc3339(NOW - 60),
        names.STATE: "Warned",
    }


def with_owners(
    snap: Snapshot,
    objects: Iterable[OwnerObject],
    autoscalers: Mapping[OwnerKey, str] | None = None,
    error: str = "",
) -> Snapshot:
    index = {(o.namespace, o.ref.kind, o.ref.name): o for o in objects}
    return replace(snap, owners=index, autoscalers=dict(autoscalers or {}), owners_error=error)


def our_record(kind: str, name: str, namespace: str = "team-a", **fields: Any) -> Reclamation:
    """The status record of our reclamation of ``kind/name`` (its uid as ``ref`` makes it)."""
    base: dict[str, Any] = {
        "owner": f"{namespace}/{kind}/{name}", "uid": ref(kind, name).uid, "action": "ScaleToZero",
        "time": format_rfc3339(NOW - 600), "replicas": 1,
    }  # fmt: skip
    return Reclamation.model_validate(base | fields)


def with_records(snap: Snapshot, *records: Reclamation) -> Snapshot:
    """``snap`` whose previous status holds ``records`` (our own proof of reclamation)."""
    return replace(snap, status=snap.status.model_copy(update={"reclamations": list(records)}))
