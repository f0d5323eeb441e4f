"""What the runner sees of the cluster at one instant, and the pod history it keeps across instants.

Plain data built from API JSON, so expectation checks are pure functions testable without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_efficiency_sim.simulator import WORKLOAD_LABEL

JSON = dict[str, Any]


@dataclass
class PodRecord:
    """One pod of a workload, from when the runner first saw it."""

    namespace: str
    name: str
    uid: str
    first_seen: float
    evicted_at: float | None = None  # first time seen terminating or gone
    how: str = ""  # what the eviction looked like: DisruptionTarget reason, deleted, phase Failed ...
    original: bool = False


@dataclass
class WorkloadHistory:
    """Every pod a workload ever had. Pods seen before the first eviction are its original pods."""

    namespace: str
    name: str
    pods: dict[str, PodRecord] = field(default_factory=dict)
    any_evicted: bool = False

    def evictions(self, *, original_only: bool, since: float = float("-inf")) -> list[PodRecord]:
        return [
            p
            for p in self.pods.values()
            if p.evicted_at is not None and p.evicted_at >= since and (p.original or not original_only)
        ]


def _disruption(pod: Mapping[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"DisruptionTarget: {cond.get('reason', '')}".strip()
    return ""


def update_histories(
    histories: Mapping[tuple[str, str], WorkloadHistory], pods: Iterable[JSON], t: float
) -> None:
    """Fold one observation of the workloads' pods into their histories."""
    present: dict[tuple[str, str], dict[str, JSON]] = {key: {} for key in histories}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str((meta.get("labels") or {}).get(WORKLOAD_LABEL, "")))
        if key in present:
            present[key][str(meta.get("uid", ""))] = pod
    for key, history in histories.items():
        live = present[key]
        # Evictions first: a replacement seen in the same poll as the eviction is not an original pod.
        for uid, record in history.pods.items():
            if record.evicted_at is None:
                seen = live.get(uid)
                how = "deleted" if seen is None else _terminated(seen)
                if how:
                    record.evicted_at, record.how = t, how
        history.any_evicted = history.any_evicted or any(
            r.evicted_at is not None for r in history.pods.values()
        )
        for uid, pod in live.items():
            if uid in history.pods:
                continue
            meta = pod.get("metadata") or {}
            record = PodRecord(key[0], str(meta.get("name", "")), uid, t, original=not history.any_evicted)
            how = _terminated(pod)
            if how:
                record.evicted_at, record.how = t, how
            history.pods[uid] = record


def _terminated(pod: JSON) -> str:
    """How a pod looks evicted ("" if it does not)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") is not None:
        return _disruption(pod) or "terminating (deletionTimestamp set)"
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return "phase Failed, reason Evicted"
    return ""


def current_pods(pods: Iterable[JSON], namespace: str, workload: str) -> list[JSON]:
    """The workload's pods that are not terminating or finished."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != namespace or (meta.get("labels") or {}).get(WORKLOAD_LABEL) != workload:
            continue
        if meta.get("deletionTimestamp") is not None:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(pod)
    return out


@dataclass
class Observation:
    """One poll of the cluster (and Prometheus), at scenario time ``t``."""

    t: float
    pods: list[JSON] = field(default_factory=list)
    nodes: dict[str, JSON] = field(default_factory=dict)  # real node name -> node
    policies: dict[str, JSON] = field(default_factory=dict)  # name -> policy
    events: list[JSON] = field(default_factory=list)
    queries: dict[str, list[tuple[dict[str, str], float]] | str] = field(default_factory=dict)  # error text
    workloads: dict[tuple[str, str], JSON | None] = field(default_factory=dict)  # (ns, name) -> object
