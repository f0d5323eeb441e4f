"""Eviction safety filters and caps (safety rule 4 in docs/safety.md; docs/architecture.md, "Budgets").

Permanent filters (static, DaemonSet, bare, high priority) stop a pod from ever being warned, so no
pod carries an ``evict-after`` that cannot come true. Temporary ones (warm-up) and the caps only
postpone: the pod keeps its clock and warning and is retried next cycle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine.model import PodView
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.reclaimproof import kept

HOUR_S = 3600.0


def permanent_blocker(pod: PodView, params: CycleParams) -> str:
    """Why this pod may never be evicted ('' when it may)."""
    if pod.is_static:
        return "static (mirror) pods are never evicted"
    if pod.controller_kind == "DaemonSet":
        return "DaemonSet pods are never evicted"
    if pod.controller_kind is None and not params.allow_bare_pods:
        return "bare pod without a controller (eviction.allowBarePods is false)"
    if pod.priority >= params.priority_threshold:
        return f"priority {pod.priority} >= eviction.priorityThreshold {params.priority_threshold}"
    return ""


def temporary_blocker(pod: PodView, params: CycleParams, now: float) -> str:
    """Why this pod may not be evicted this cycle ('' when it may)."""
    if pod.deleting:
        return "the pod is already being deleted"
    if pod.start_time is None:
        return "the pod's start time is unknown"
    age = now - pod.start_time
    if age < params.min_pod_age_s:
        return f"pod age {format_duration(age)} < minPodAge {format_duration(params.min_pod_age_s)}"
    return ""


def recent_within_hour(recent: Iterable[str], now: float) -> list[str]:
    """Eviction times of the last hour (unparsable entries dropped): the rolling per-hour budget.

    A time ahead of ``now`` (by less than the hour) is kept: another replica whose clock runs ahead
    stamped it, and dropping it would free that eviction's share of the budget at once."""
    kept = []
    for text in recent:
        ts = parse_rfc3339(text)
        if ts is not None and now - HOUR_S < ts < now + HOUR_S:
            kept.append(text)
    return kept


def merge_recent(ours: Iterable[str], theirs: Iterable[str], now: float) -> list[str]:
    """The union of two records of the hour's evictions, pruned to the hour, oldest first.

    Status keeps one time per eviction (evictions of one cycle share its time), so the union is per
    time: each time as often as the record that has it more often. Merging a record with itself,
    or with an older copy of itself, changes nothing."""
    counts = Counter(recent_within_hour(ours, now))
    for text, n in Counter(recent_within_hour(theirs, now)).items():
        counts[text] = max(counts[text], n)
    return sorted(counts.elements(), key=lambda text: (parse_rfc3339(text) or 0.0, text))


def merge_budgets(
    base: GPUEfficiencyPolicyStatus, other: GPUEfficiencyPolicyStatus, now: float
) -> GPUEfficiencyPolicyStatus:
    """``base`` with the eviction budget state of both: recent evictions united, totals the larger.

    Used where two views of one policy's status meet (the server's at a term start or after a
    write conflict, and this replica's): neither may drop an eviction the other counted."""
    return base.model_copy(
        update={
            "recent_evictions": merge_recent(base.recent_evictions, other.recent_evictions, now),
            "evictions_total": max(base.evictions_total, other.evictions_total),
            "evictions_blocked_total": max(base.evictions_blocked_total, other.evictions_blocked_total),
            "reclaims_total": max(base.reclaims_total, other.reclaims_total),
            "reclaims_reverted_total": max(base.reclaims_reverted_total, other.reclaims_reverted_total),
            "reclaims_ineffective_total": max(
                base.reclaims_ineffective_total, other.reclaims_ineffective_total
            ),
            "reclamations": merge_reclamations(base.reclamations, other.reclamations),
        }
    )


def merge_reclamations(ours: Sequence[Reclamation], theirs: Sequence[Reclamation]) -> list[Reclamation]:
    """The reclamation records of both, each once (by owner and time; ours where both have it),
    oldest first: they are the proof restore and the engine rely on, so a merge never drops one."""
    seen = {(r.owner, r.time) for r in ours}
    both = [*ours, *(r for r in theirs if (r.owner, r.time) not in seen)]
    return kept(sorted(both, key=lambda r: parse_rfc3339(r.time) or 0.0))


@dataclass(frozen=True, slots=True)
class EvictionCandidate:
    """An idle pod whose warning period is over."""

    pod: PodView
    idle_since: float
    message: str  # becomes EvictPod.reason and the GPUIdleEvicted event text


@dataclass(frozen=True, slots=True)
class EvictionSelection:
    selected: tuple[EvictionCandidate, ...]
    notes: tuple[str, ...]  # one line per candidate not evicted, saying why


def cap_reached(
    what: str,
    params: CycleParams,
    *,
    namespace: str,
    taken: int,
    in_namespace: int,
    hour_left: int,
    last_hour: int,
) -> str:
    """Why one more ``what`` (eviction, reclaim) waits for a later cycle, or '' when the per-cycle,
    per-hour and per-namespace caps all leave room. Evictions and owner reclaims share the caps."""
    if taken >= params.max_per_cycle:
        return f"{what} postponed: maxPerCycle {params.max_per_cycle} reached; retried next cycle"
    if taken >= hour_left:
        return (
            f"{what} postponed: maxPerHour {params.max_per_hour} reached "
            f"({last_hour} in the last hour); retried next cycle"
        )
    if in_namespace >= params.max_per_namespace:
        return (
            f"{what} postponed: maxPerNamespacePerCycle {params.max_per_namespace} reached "
            f"in {namespace}; retried next cycle"
        )
    return ""


def select_evictions(
    candidates: Sequence[EvictionCandidate], params: CycleParams, now: float, evictions_last_hour: int
) -> EvictionSelection:
    """Apply the filters and the caps in a deterministic order: longest idle first, then namespace/name."""
    ordered = sorted(candidates, key=lambda c: (c.idle_since, c.pod.namespace, c.pod.name))
    hour_left = max(0, params.max_per_hour - evictions_last_hour)
    per_namespace: Counter[str] = Counter()
    selected: list[EvictionCandidate] = []
    notes: list[str] = []
    for candidate in ordered:
        pod = candidate.pod
        who = f"{pod.namespace}/{pod.name}"
        blocker = permanent_blocker(pod, params) or temporary_blocker(pod, params, now)
        capped = cap_reached(
            "eviction",
            params,
            namespace=pod.namespace,
            taken=len(selected),
            in_namespace=per_namespace[pod.namespace],
            hour_left=hour_left,
            last_hour=evictions_last_hour,
        )
        if blocker:
            notes.append(f"{who}: eviction skipped: {blocker}")
        elif capped:
            notes.append(f"{who}: {capped}")
        else:
            per_namespace[pod.namespace] += 1
            selected.append(candidate)
    return EvictionSelection(tuple(selected), tuple(notes))
