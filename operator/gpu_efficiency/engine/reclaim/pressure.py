"""Reclaim on pressure: which due idle owners to reclaim so that waiting GPU pods fit, and no more.

With ``reclaimWhen: OnPressure`` an idle owner whose warning is over is reclaimed only while a GPU
pod waits Pending as unschedulable for lack of ``nvidia.com/gpu``. The scheduler is modelled as far
as the pod says: its GPU request against each node's allocatable GPUs minus the GPUs of the pods
bound there, its nodeSelector, its required node affinity and its tolerations of the node's
NoSchedule/NoExecute taints (a cordoned node is tainted ``node.kubernetes.io/unschedulable``).
Anything else that can keep a pod Pending (CPU, pod affinity, topology spread) is not modelled: a pod
that fits by GPUs alone is left to the scheduler and nothing is reclaimed for it, so the model can
only err towards reclaiming less.

Waiting pods are served in the scheduler's order (priority, then age). A pod that already fits in
free GPUs (including GPUs of pods already on their way out) takes them; otherwise the fewest due
owners whose GPUs on one node make it fit are chosen (best fit: the smallest owner that covers the
deficit, else the largest and repeat), then any chosen owner the pod can do without is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api.names import GPU_RESOURCE
from gpu_efficiency.engine.model import (
    NodeRequirement,
    NodeView,
    OwnerKey,
    PendingPod,
    PodView,
    Taint,
    Toleration,
)

UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def waiting_for_gpus(pod: PendingPod) -> bool:
    """Pending as unschedulable (PodScheduled=False, reason Unschedulable) for lack of GPUs."""
    return (
        pod.gpu_request > 0
        and pod.scheduled_reason == "Unschedulable"
        and GPU_RESOURCE in pod.scheduled_message
    )


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """The Kubernetes toleration rule (an empty key with Exists tolerates every taint)."""
    return toleration.tolerates(taint)


def _requirement_holds(req: NodeRequirement, node: NodeView) -> bool:
    fields = {"metadata.name": node.name}
    value = fields.get(req.key) if req.field else node.labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # an operator we cannot read matches nothing: never reclaim on a guess


def allocatable(node: NodeView) -> int:
    return node.gpu_capacity if node.gpu_allocatable is None else node.gpu_allocatable


def may_run_on(pod: PendingPod, node: NodeView) -> bool:
    """The pod's nodeSelector, required node affinity and tolerations allow ``node``."""
    if pod.unreadable or allocatable(node) < pod.gpu_request:
        return False
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    if pod.affinity_terms and not any(
        term and all(_requirement_holds(r, node) for r in term) for term in pod.affinity_terms
    ):
        return False
    taints = (*node.taints, UNSCHEDULABLE_TAINT) if node.unschedulable else node.taints
    return all(
        any(tolerates(t, taint) for t in pod.tolerations)
        for taint in taints
        if taint.effect in _BLOCKING_EFFECTS
    )


def free_gpus(nodes: Sequence[NodeView], pods: Sequence[PodView], freeing: frozenset[str]) -> dict[str, int]:
    """Allocatable GPUs per node not held by a bound pod. Pods being deleted, and pods in
    ``freeing`` (by uid: those of owners already reclaimed), are on their way out: their GPUs count
    as free, so what is already being reclaimed is not reclaimed twice."""
    used: dict[str, int] = {}
    for pod in pods:
        if pod.node and pod.phase not in _DONE_PHASES and not pod.deleting and pod.uid not in freeing:
            used[pod.node] = used.get(pod.node, 0) + pod.gpu_request
    return {n.name: max(0, allocatable(n) - used.get(n.name, 0)) for n in nodes}


@dataclass(frozen=True, slots=True)
class PressureChoice:
    chosen: tuple[OwnerKey, ...]  # the owners to reclaim, in the order they were chosen
    served: Mapping[OwnerKey, tuple[str, ...]]  # NAMESPACE/NAME of the waiting pods each was chosen for
    waiting: tuple[PendingPod, ...]  # GPU pods waiting unschedulable for lack of GPUs
    notes: tuple[str, ...]


def _label(key: OwnerKey) -> str:
    return f"{key[0]}/{key[1].lower()}/{key[2]}"


def _best_fit(offers: list[tuple[int, int, OwnerKey]], deficit: int) -> list[OwnerKey] | None:
    """The owners (``offers``: GPUs here, order, key) whose GPUs cover ``deficit``: the smallest one
    that covers what is left, else the largest and repeat. None when all together fall short."""
    if sum(g for g, _, _ in offers) < deficit:
        return None
    pool = sorted(offers)
    picks: list[OwnerKey] = []
    while deficit > 0:
        covering = next((o for o in pool if o[0] >= deficit), None)
        chosen = covering if covering is not None else max(pool, key=lambda o: (o[0], -o[1]))
        picks.append(chosen[2])
        deficit -= chosen[0]
        pool.remove(chosen)
    return picks


def choose_for_pressure(
    nodes: Sequence[NodeView],
    pods: Sequence[PodView],
    pending: Sequence[PendingPod],
    candidates: Mapping[OwnerKey, Mapping[str, int]],
    freeing: frozenset[str] = frozenset(),
) -> PressureChoice:
    """The fewest ``candidates`` (due owners: GPUs they would free per node, in preference order)
    whose reclamation makes the waiting pods fit, served in the scheduler's order."""
    waiting = tuple(
        sorted(
            (p for p in pending if waiting_for_gpus(p)),
            key=lambda p: (
                -p.priority,
                p.created if p.created is not None else float("inf"),
                p.namespace,
                p.name,
            ),
        )
    )
    free = free_gpus(nodes, pods, freeing)
    order = {key: i for i, key in enumerate(candidates)}
    pool = {key: dict(by_node) for key, by_node in candidates.items()}
    chosen: list[OwnerKey] = []
    served: dict[OwnerKey, tuple[str, ...]] = {}
    notes: list[str] = []
    for pod in waiting:
        who = f"{pod.namespace}/{pod.name} ({pod.gpu_request} GPU(s))"
        if pod.unreadable:
            notes.append(f"pending {who}: nothing reclaimed for it: {pod.unreadable}")
            continue
        eligible = sorted(n.name for n in nodes if may_run_on(pod, n))
        if not eligible:
            notes.append(
                f"pending {who}: no node its nodeSelector, affinity and tolerations allow has enough "
                "allocatable GPUs: nothing reclaimed for it"
            )
            continue
        fitting = [n for n in eligible if free[n] >= pod.gpu_request]
        if fitting:
            place = min(fitting, key=lambda n: (free[n], n))
            free[place] -= pod.gpu_request
            notes.append(f"pending {who}: fits in free GPUs on {place}: nothing reclaimed for it")
            continue
        options: list[tuple[int, int, str, list[OwnerKey]]] = []
        for node in eligible:
            offers = [(by_node[node], order[key], key) for key, by_node in pool.items() if by_node.get(node)]
            picks = _best_fit(offers, pod.gpu_request - free[node])
            if picks is not None:
                options.append((len(picks), sum(sum(pool[k].values()) for k in picks), node, picks))
        if not options:
            notes.append(
                f"pending {who}: the due idle owners do not free enough GPUs for it on any node it may use"
            )
            continue
        picks = min(options, key=lambda o: o[:3])[3]
        for key in sorted(picks, key=lambda k: (-sum(pool[k].values()), order[k])):
            rest = [k for k in picks if k != key]
            if _place(pod, eligible, free, pool, rest) is not None:
                picks = rest  # the pod fits without this one
        target = _place(pod, eligible, free, pool, picks)
        if target is None:  # unreachable: the picks were chosen to fit; keeps the type checker exact
            continue
        for key in picks:
            for node, gpus in pool.pop(key).items():
                free[node] = free.get(node, 0) + gpus
            chosen.append(key)
            served[key] = (*served.get(key, ()), f"{pod.namespace}/{pod.name}")
        free[target] -= pod.gpu_request
        notes.append(
            f"pending {who}: reclaiming {', '.join(_label(k) for k in picks)} makes it fit on {target}"
        )
    return PressureChoice(tuple(chosen), served, waiting, tuple(notes))


def _place(
    pod: PendingPod,
    eligible: Sequence[str],
    free: Mapping[str, int],
    pool: Mapping[OwnerKey, Mapping[str, int]],
    picks: Sequence[OwnerKey],
) -> str | None:
    """The node the pod fits on once ``picks`` are reclaimed (the tightest, then by name)."""
    room = {n: free[n] + sum(pool[k].get(n, 0) for k in picks) for n in eligible}
    fitting = [n for n in eligible if room[n] >= pod.gpu_request]
    return min(fitting, key=lambda n: (room[n], n)) if fitting else None
