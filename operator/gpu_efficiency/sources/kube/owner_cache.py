"""The pods' owners as the long-running operator keeps them between LISTs: watched, for the cycles
that need only a current view of them (``engine.OwnerRead.CACHED``: annotation texts, straggler
events), so a steady cycle makes no request.

Why: a cycle that needs only the last owner read reused it for up to five minutes, then LISTed
the seven kinds again (replicasets, deployments, statefulsets, jobs, cronjobs, HPAs, PDBs) with the
CRD kinds' discovery (8 GETs): 15 requests in one steady cycle every five minutes, as long as some
pod had an idle clock. Seven informers (``sources/kube/watch.py``) keep the same views the LIST
builds (``owners.owner_object``, ``hpa_target``, ``disruption_budget``) instead.

Safety: a warning, a due pod and every reclaim still LIST (``OwnerReader.read``, a quorum read):
this cache never decides an action, it only stands for the last read. It stands for none
(``current`` is None, and the runtime keeps its five-minute reuse of the last LIST) while an
informer is not synced or its watch cannot be vouched for, and while a CRD owner kind is installed
(KubeRay, Kueue, ...: those kinds are LISTed only; the CRDs themselves are watched, which the
chart's ClusterRole already allows for Kopf).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kubernetes import client

from gpu_efficiency.engine.model import DisruptionBudget, OwnerKey, OwnerObject
from gpu_efficiency.sources.kube.owners import (
    HPA_PATH,
    OWNER_KINDS,
    PDB_PATH,
    OwnerKind,
    OwnerReader,
    OwnerState,
    disruption_budget,
    hpa_target,
    owner_object,
)
from gpu_efficiency.sources.kube.watch import Informer, InformerSet

#: Objects per LIST page of the owner kinds (a few KiB each), and of the CRDs (whose schemas can
#: reach hundreds of KiB each: only their names are kept).
PAGE_SIZE = 100
CRD_PAGE_SIZE = 10
_OWNER_CRDS = frozenset((k.group, k.plural) for k in OWNER_KINDS if not k.builtin)

ListFor = Callable[[str, str, str], Callable[..., Any]]  # (group, version, plural) -> bound LIST


def owner_crd(obj: Mapping[str, Any]) -> str:
    """``group/plural`` of a CRD that serves an owner kind we read ('' for any other CRD)."""
    spec = obj.get("spec") or {}
    group, plural = spec.get("group") or "", (spec.get("names") or {}).get("plural") or ""
    served = any(v.get("served") for v in spec.get("versions") or ())
    return f"{group}/{plural}" if served and (group, plural) in _OWNER_CRDS else ""


def _hpa(obj: Mapping[str, Any]) -> tuple[OwnerKey | None, str]:
    return hpa_target(obj), str((obj.get("metadata") or {}).get("name") or "")


def _budget_order(budget: DisruptionBudget | None) -> tuple[str, str]:
    return (budget.namespace, budget.name) if budget is not None else ("", "")


def _owner_order(view: OwnerObject) -> tuple[str, str, str]:
    return (view.namespace, view.ref.kind, view.ref.name)


def _path_parts(path: str) -> tuple[str, str, str]:
    _, group, version, plural = path.strip("/").split("/")
    return group, version, plural


class OwnerCache(InformerSet):
    """One informer per built-in owner kind, the HPAs, the PodDisruptionBudgets, and the CRDs."""

    def __init__(self, list_for: ListFor, **options: Any) -> None:
        options.setdefault("page_size", PAGE_SIZE)
        self.kinds: tuple[tuple[OwnerKind, Informer[OwnerObject]], ...] = tuple(
            (
                kind,
                Informer(
                    kind.plural,
                    list_for(kind.group, kind.version, kind.plural),
                    partial(owner_object, kind),
                    order=_owner_order,
                    **options,
                ),
            )
            for kind in OWNER_KINDS
            if kind.builtin
        )
        self.autoscalers: Informer[tuple[OwnerKey | None, str]] = Informer(
            "horizontalpodautoscalers",
            list_for(*_path_parts(HPA_PATH)),
            _hpa,
            keep=lambda v: v[0] is not None,
            order=lambda v: v[0] or ("", "", ""),
            **options,
        )
        self.budgets: Informer[DisruptionBudget | None] = Informer(
            "poddisruptionbudgets",
            list_for(*_path_parts(PDB_PATH)),
            disruption_budget,
            keep=lambda v: v is not None,
            order=_budget_order,
            **options,
        )
        self.crds: Informer[str] = Informer(
            "customresourcedefinitions",
            list_for("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
            owner_crd,
            keep=bool,
            order=str,
            **{**options, "page_size": CRD_PAGE_SIZE},
        )

    @classmethod
    def for_client(cls, api_client: client.ApiClient, **options: Any) -> OwnerCache:
        custom = client.CustomObjectsApi(api_client)

        def list_for(group: str, version: str, plural: str) -> Callable[..., Any]:
            return partial(custom.list_cluster_custom_object, group, version, plural)

        return cls(list_for, **options)

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (*(informer for _, informer in self.kinds), self.autoscalers, self.budgets, self.crds)


class WatchedOwnerReader:
    """``OwnerReader`` (its LIST for every ``read``) plus ``current``: the watched owners, or None
    where the watch cannot stand for a read."""

    def __init__(self, cache: OwnerCache, fallback: OwnerReader) -> None:
        self.cache = cache
        self.fallback = fallback

    def start(self) -> None:
        self.cache.start()

    def stop(self) -> None:
        self.cache.stop()

    def read(self) -> OwnerState:
        return self.fallback.read()

    def current(self) -> OwnerState | None:
        crds = self.cache.crds.snapshot()
        if crds is None or crds:  # not vouched for, or a CRD owner kind is installed: LISTed only
            return None
        objects: dict[OwnerKey, OwnerObject] = {}
        for _, informer in self.cache.kinds:
            views = informer.snapshot()
            if views is None:
                return None
            objects.update(((v.namespace, v.ref.kind, v.ref.name), v) for v in views)
        hpas, budgets = self.cache.autoscalers.snapshot(), self.cache.budgets.snapshot()
        if hpas is None or budgets is None:
            return None
        autoscalers = {target: name for target, name in hpas if target is not None}
        return OwnerState(objects, autoscalers, 0, tuple(b for b in budgets if b is not None))
