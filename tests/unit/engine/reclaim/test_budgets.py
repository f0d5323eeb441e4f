"""Eviction caps and filters: per cycle, per namespace, per hour; warm-up; deterministic order."""

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    NOW,
    enforce,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    pod,
    snapshot,
)

from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, PodView
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.budgets import merge_budgets, merge_recent, recent_within_hour

pytestmark = pytest.mark.usefixtures("no_faults")


def due(name: str, namespace: str = "team-a", idle_minutes: int = 30, **fields: Any) -> PodView:
    """A pod idle for ``idle_minutes`` whose warning period is over."""
    ann = {
        names.IDLE_SINCE: format_rfc3339(NOW - idle_minutes * 60),
        names.EVICT_AFTER: format_rfc3339(NOW - 60),
        names.STATE: "Warned",
    }
    return pod(name, namespace, annotations=ann, **fields)


def evicted(pods: list[PodView], status: GPUEfficiencyPolicyStatus | None = None, **spec: Any) -> list[str]:
    gpus = [gpu(f"GPU-{p.namespace}-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    plan = plan_cycle(snapshot(gpus, pods, enforce(**spec), status=status))
    return [f"{a.namespace}/{a.name}" for a in plan.actions if isinstance(a, EvictPod)]


def test_per_cycle_cap_longest_idle_first() -> None:
    pods = [due(f"p{i}", f"ns{i}", idle_minutes=30 + i) for i in range(6)]
    assert evicted(pods, eviction={"max_per_cycle": 2}) == ["ns5/p5", "ns4/p4"]


def test_order_ties_break_by_namespace_then_name() -> None:
    pods = [due("b", "ns1"), due("a", "ns2"), due("a", "ns1")]
    assert evicted(pods, eviction={"max_per_cycle": 2}) == ["ns1/a", "ns1/b"]


def test_per_namespace_cap() -> None:
    pods = [due(f"p{i}", "busy") for i in range(4)] + [due("q", "quiet")]
    assert evicted(pods, eviction={"max_per_namespace_per_cycle": 1}) == ["busy/p0", "quiet/q"]


def test_hourly_budget_counts_recent_evictions_from_status() -> None:
    recent = [format_rfc3339(NOW - 600), format_rfc3339(NOW - 1200), format_rfc3339(NOW - 4000)]
    status = GPUEfficiencyPolicyStatus(recent_evictions=recent)
    pods = [due(f"p{i}", f"ns{i}") for i in range(5)]
    assert len(evicted(pods, status, eviction={"max_per_hour": 3})) == 1  # 2 within the hour


def test_zero_caps_evict_nothing_and_say_why() -> None:
    pods = [due("p")]
    gpus = [gpu("GPU-0", b.idle(), ("team-a", "p"))]
    plan = plan_cycle(snapshot(gpus, pods, enforce(eviction={"max_per_cycle": 0})))
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    assert any("maxPerCycle 0 reached; retried next cycle" in n for n in plan.notes)


def test_postponed_eviction_keeps_clock_and_happens_next_cycle() -> None:
    pods = [due("p0", "a", 40), due("p1", "b", 30)]
    gpus = [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    snap = snapshot(gpus, pods, enforce(eviction={"max_per_cycle": 1}))
    first = plan_cycle(snap)
    assert [a.name for a in first.actions if isinstance(a, EvictPod)] == ["p0"]
    (patch,) = [a.annotations for a in first.actions if isinstance(a, AnnotatePod) and a.name == "p1"]
    assert names.IDLE_SINCE not in patch  # clock untouched
    assert names.EVICT_AFTER not in patch
    second = plan_cycle(b.apply_plan(snap, first))
    assert [a.name for a in second.actions if isinstance(a, EvictPod)] == ["p1"]


def test_young_pod_not_evicted_until_min_pod_age() -> None:
    young = due("p", start_time=NOW - 300)  # 5m old; minPodAge defaults to the 10m window
    assert evicted([young]) == []
    assert evicted([young], eviction={"min_pod_age": "4m"}) == ["team-a/p"]
    assert evicted([replace(young, start_time=None)]) == []


def test_recent_within_hour_prunes_old_and_garbage() -> None:
    kept = recent_within_hour(
        [format_rfc3339(NOW - 10), format_rfc3339(NOW - 3700), "garbage", format_rfc3339(NOW + 3700)], NOW
    )
    assert kept == [format_rfc3339(NOW - 10)]


def test_a_time_stamped_by_a_replica_whose_clock_runs_ahead_still_counts() -> None:
    ahead = format_rfc3339(NOW + 12)
    assert recent_within_hour([ahead], NOW) == [ahead]
    pods = [due(f"p{i}", f"ns{i}") for i in range(3)]
    status = GPUEfficiencyPolicyStatus(recent_evictions=[ahead, ahead])
    assert len(evicted(pods, status, eviction={"max_per_hour": 3})) == 1


def test_merged_records_keep_every_eviction_of_either_once() -> None:
    t1, t2, t3 = (format_rfc3339(NOW - s) for s in (300, 200, 100))
    old = format_rfc3339(NOW - 4000)
    server, local = [t1, t1, t2, old], [t1, t2, t2, t3]
    assert merge_recent(server, local, NOW) == [t1, t1, t2, t2, t3]
    assert merge_recent(server, server, NOW) == [t1, t1, t2]
    assert merge_recent(local, [t1], NOW) == local


def test_merging_budgets_keeps_the_base_and_the_larger_totals() -> None:
    t1 = format_rfc3339(NOW - 60)
    base = GPUEfficiencyPolicyStatus(evictions_total=3, evictions_blocked_total=1, warned_pods=7)
    other = GPUEfficiencyPolicyStatus(
        recent_evictions=[t1], evictions_total=4, warned_pods=2, reclaims_total=2
    )
    merged = merge_budgets(base, other, NOW)
    assert (merged.recent_evictions, merged.evictions_total, merged.evictions_blocked_total) == ([t1], 4, 1)
    assert merged.reclaims_total == 2
    assert merged.warned_pods == 7


def test_merging_budgets_keeps_every_reclamation_record_of_both() -> None:
    """The records prove what we reclaimed (restore needs them): a term start merging the server's
    status with this replica's never drops one either side has."""
    old, new = (format_rfc3339(NOW - s) for s in (600, 60))
    server = [Reclamation(owner="ml/Deployment/a", uid="ua", action="ScaleToZero", time=old)]
    local = [*server, Reclamation(owner="ml/Deployment/b", uid="ub", action="ScaleToZero", time=new)]
    merged = merge_budgets(
        GPUEfficiencyPolicyStatus(reclamations=server), GPUEfficiencyPolicyStatus(reclamations=local), NOW
    )
    assert [r.uid for r in merged.reclamations] == ["ua", "ub"]
