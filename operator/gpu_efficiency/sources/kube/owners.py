"""Read the controller objects that own GPU pods, and the HPAs' targets, for owner resolution.

CronJobs are read for their concurrencyPolicy only (their Jobs are suspended, never the CronJob:
the reclaim event says what the next scheduled run will do). An HPA's target is scaled like any
other owner, and the HPA's name is recorded on it (engine/reclaim/owners.py says why that is safe).

A cycle reads them only when some pod carries ``idle-since`` (nothing can be reclaimed before):
one paged LIST per kind, cluster-wide, whatever the number of pods. Kinds from CRDs (JobSet,
LeaderWorkerSet, Notebook, InferenceService, and those of crd_owners.py: KubeRay, Kubeflow
training, Kueue's Workloads) are found by discovery; an integration whose CRD is
not served, or that RBAC does not let us list, is skipped with one log line, and pods owned by it
resolve to an unknown owner (recommendation only). A failure to read a built-in kind raises
``OwnersUnavailable``: then nothing with a controller is acted on this cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import LabelSelector
from gpu_efficiency.api.suspend_fields import is_suspended
from gpu_efficiency.engine.model import DisruptionBudget, OwnerKey, OwnerObject, OwnerRef
from gpu_efficiency.sources.kube.cluster import own_annotations
from gpu_efficiency.sources.kube.crd_owners import CRD_OWNER_KINDS, cannot_suspend, kueue_queue

log = logging.getLogger(__name__)

#: GET path + query -> decoded JSON; raises ApiException (tests pass a fake).
Fetch = Callable[[str, Mapping[str, str]], Mapping[str, Any]]
PAGE_SIZE = 500
REDISCOVER_SECONDS = 60.0  # a CRD installed later is picked up within this (one GET per group version, only while pods are idle)


@dataclass(frozen=True, slots=True)
class OwnerKind:
    kind: str
    group: str
    version: str
    plural: str
    builtin: bool  # served by every cluster (apps, batch): a failure is an error, not a skip

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/{self.plural}"


OWNER_KINDS = (
    OwnerKind("ReplicaSet", "apps", "v1", "replicasets", True),
    OwnerKind("Deployment", "apps", "v1", "deployments", True),
    OwnerKind("StatefulSet", "apps", "v1", "statefulsets", True),
    OwnerKind("Job", "batch", "v1", "jobs", True),
    OwnerKind("CronJob", "batch", "v1", "cronjobs", True),
    OwnerKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", False),
    OwnerKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", False),
    OwnerKind("Notebook", "kubeflow.org", "v1", "notebooks", False),
    OwnerKind("InferenceService", "serving.kserve.io", "v1beta1", "inferenceservices", False),
    *(OwnerKind(kind, group, version, plural, False) for kind, group, version, plural in CRD_OWNER_KINDS),
)
HPA_PATH = "/apis/autoscaling/v2/horizontalpodautoscalers"
PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"


class OwnersUnavailable(Exception):  # noqa: N818 - reads as a state, like SourceUnavailable
    """A built-in owner kind or the HPAs could not be read."""


@dataclass(frozen=True, slots=True)
class OwnerState:
    objects: Mapping[OwnerKey, OwnerObject]
    autoscalers: Mapping[OwnerKey, str]  # scaleTargetRef -> the HPA's name
    requests: int  # API calls made
    disruption_budgets: tuple[DisruptionBudget, ...] = ()


def owner_object(kind: OwnerKind, item: Mapping[str, Any]) -> OwnerObject:
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    controller = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    annotations = meta.get("annotations") or {}
    ours = own_annotations(annotations)
    if names.KUBEFLOW_STOPPED in annotations:
        ours[names.KUBEFLOW_STOPPED] = annotations[names.KUBEFLOW_STOPPED]
    replicas = spec.get("replicas")
    concurrency = spec.get("concurrencyPolicy")
    return OwnerObject(
        namespace=meta.get("namespace", ""),
        ref=OwnerRef(kind.api_version, kind.kind, meta.get("name", ""), meta.get("uid", "")),
        controller=(
            OwnerRef(
                controller.get("apiVersion", ""),
                controller.get("kind", ""),
                controller.get("name", ""),
                controller.get("uid", ""),
            )
            if controller
            else None
        ),
        annotations=ours,
        replicas=replicas
        if isinstance(replicas, int)
        else (1 if kind.kind in ("Deployment", "ReplicaSet", "StatefulSet") else None),
        suspended=is_suspended(kind.kind, spec),
        kueue_queue=kueue_queue(meta),
        cannot_suspend=cannot_suspend(kind.kind, spec),
        concurrency_policy=concurrency if kind.kind == "CronJob" and isinstance(concurrency, str) else "",
    )


def disruption_budget(item: Mapping[str, Any]) -> DisruptionBudget | None:
    """A PDB as the engine reads it; one whose selector cannot be read covers every pod (fail closed)."""
    meta = item.get("metadata") or {}
    selector = (item.get("spec") or {}).get("selector")
    if selector is None:  # policy/v1: a null selector selects no pod
        return None
    try:
        parsed = LabelSelector.model_validate(selector)
    except ValidationError:
        parsed = LabelSelector()
    allowed = (item.get("status") or {}).get("disruptionsAllowed")
    return DisruptionBudget(
        meta.get("namespace", ""), meta.get("name", ""), parsed, allowed if isinstance(allowed, int) else 0
    )


def hpa_target(item: Mapping[str, Any]) -> OwnerKey | None:
    meta = item.get("metadata") or {}
    target = (item.get("spec") or {}).get("scaleTargetRef") or {}
    if not target.get("kind") or not target.get("name"):
        return None
    return (meta.get("namespace", ""), target["kind"], target["name"])


class OwnerSource(Protocol):
    """What a cycle reads owners from: ``OwnerReader``, or the watched ``owner_cache.WatchedOwnerReader``."""

    def read(self) -> OwnerState:
        """Every owner, HPA and PodDisruptionBudget by LIST (what a warning or an action needs)."""
        ...

    def current(self) -> OwnerState | None:
        """The owners as a watch keeps them, without a request; None where none can stand for a read."""
        ...

    def start(self) -> None: ...
    def stop(self) -> None: ...


class OwnerReader:
    """Lists owner objects and HPAs; remembers which CRD integrations are served (discovery)."""

    def __init__(self, fetch: Fetch, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.clock = clock
        self._served: dict[str, bool] = {}  # path -> served, by discovery
        self._discovered_at = float("-inf")
        self._skipped_logged: set[str] = set()

    def _discover(self) -> int:
        """Which CRD kinds are served; logs once per kind that is skipped. Returns calls made."""
        if self.clock() - self._discovered_at < REDISCOVER_SECONDS:
            return 0
        calls = 0
        groups: dict[str, set[str] | None] = {}
        for kind in OWNER_KINDS:
            if kind.builtin:
                continue
            if kind.api_version not in groups:
                calls += 1
                try:
                    doc = self.fetch(f"/apis/{kind.api_version}", {})
                    groups[kind.api_version] = {r.get("name", "") for r in doc.get("resources") or ()}
                except ApiException as exc:
                    if exc.status not in (403, 404):
                        raise OwnersUnavailable(
                            f"discovery of {kind.api_version}: HTTP {exc.status}"
                        ) from exc
                    groups[kind.api_version] = None
            self._served[kind.path] = kind.plural in (groups[kind.api_version] or set())
        for kind in OWNER_KINDS:  # a kind offered at several versions is skipped only if none is served
            versions = [k for k in OWNER_KINDS if (k.group, k.plural) == (kind.group, kind.plural)]
            if kind.builtin or kind is not versions[0]:
                continue
            served_at = next((k for k in versions if self._served.get(k.path)), None)
            if served_at is None:
                offered = " nor ".join(k.api_version for k in versions)
                self._skip_once(kind, f"{offered} {kind.plural} is not served by this cluster")
            elif kind.plural in self._skipped_logged:
                self._skipped_logged.discard(kind.plural)
                log.info(
                    "%s integration enabled: %s %s is served now",
                    kind.kind,
                    served_at.api_version,
                    kind.plural,
                )
        self._discovered_at = self.clock()
        return calls

    def _skip_once(self, kind: OwnerKind, why: str) -> None:
        if kind.plural not in self._skipped_logged:
            self._skipped_logged.add(kind.plural)
            log.info(
                "%s integration skipped: %s; pods it owns are only given recommendations", kind.kind, why
            )

    def _list(self, path: str) -> tuple[list[Mapping[str, Any]], int]:
        items: list[Mapping[str, Any]] = []
        token, calls = "", 0
        while True:
            query = {"limit": str(PAGE_SIZE)} | ({"continue": token} if token else {})
            doc = self.fetch(path, query)
            calls += 1
            items.extend(doc.get("items") or ())
            token = (doc.get("metadata") or {}).get("continue") or ""
            if not token:
                return items, calls

    def current(self) -> OwnerState | None:
        return None  # nothing watched: every read LISTs

    def start(self) -> None:
        """Nothing to start: a LIST per read."""

    def stop(self) -> None:
        """Nothing to stop."""

    def read(self) -> OwnerState:
        calls = self._discover()
        objects: dict[OwnerKey, OwnerObject] = {}
        read_kinds: set[tuple[str, str]] = set()  # (group, kind): a kind served at two versions is read once
        for kind in OWNER_KINDS:
            if (not kind.builtin and not self._served.get(kind.path)) or (
                kind.group,
                kind.kind,
            ) in read_kinds:
                continue
            read_kinds.add((kind.group, kind.kind))
            try:
                items, made = self._list(kind.path)
            except ApiException as exc:
                if kind.builtin:
                    raise OwnersUnavailable(f"listing {kind.plural}: HTTP {exc.status} {exc.reason}") from exc
                self._skip_once(kind, f"listing {kind.plural} failed with HTTP {exc.status} (RBAC?)")
                continue
            calls += made
            for item in items:
                view = owner_object(kind, item)
                objects[(view.namespace, view.ref.kind, view.ref.name)] = view
        try:
            hpas, made = self._list(HPA_PATH)
        except ApiException as exc:
            raise OwnersUnavailable(
                f"listing horizontalpodautoscalers: HTTP {exc.status} {exc.reason}"
            ) from exc
        autoscalers: dict[OwnerKey, str] = {}
        for hpa in hpas:
            target = hpa_target(hpa)
            if target is not None:
                autoscalers[target] = (hpa.get("metadata") or {}).get("name", "")
        try:
            pdbs, listed = self._list(PDB_PATH)
        except ApiException as exc:
            raise OwnersUnavailable(f"listing poddisruptionbudgets: HTTP {exc.status} {exc.reason}") from exc
        budgets = tuple(b for b in map(disruption_budget, pdbs) if b is not None)
        return OwnerState(objects, autoscalers, calls + made + listed, budgets)


def api_fetch(api_client: client.ApiClient) -> Fetch:
    """``Fetch`` through the Kubernetes client (its pool and credentials), decoded with orjson:
    ``/apis/G/V`` is discovery, ``/apis/G/V/PLURAL`` a cluster-wide LIST (built-in kinds included)."""
    custom = client.CustomObjectsApi(api_client)

    def fetch(path: str, query: Mapping[str, str]) -> Mapping[str, Any]:
        parts = path.strip("/").split("/")  # apis, group, version[, plural]
        response: Any
        if len(parts) == 3:
            response = custom.get_api_resources(parts[1], parts[2], _preload_content=False)
        else:
            response = custom.list_cluster_custom_object(
                parts[1],
                parts[2],
                parts[3],
                limit=int(query.get("limit", PAGE_SIZE)),
                _continue=query.get("continue") or None,
                _preload_content=False,
            )
        doc: Mapping[str, Any] = orjson.loads(response.data)
        return doc

    return fetch
