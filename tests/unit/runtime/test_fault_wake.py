"""Early fault cycles: a node agent's GPUHealthy=False wakes the covering policies' cycles at once,
coalesced and rate-bounded; other writers' conditions wake nothing, and a condition alone never taints."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.engine.quarantine.support import XID_79, Cluster, gpu, node, of_type
from tests.unit.runtime.test_scheduler import Clock, FakeRunner, body

from gpu_efficiency.agent import nodecondition
from gpu_efficiency.api import names
from gpu_efficiency.engine.model import NodeCondition, NodeView, TaintNode
from gpu_efficiency.runtime.fault_wake import AGENT_FAULT_REASONS, FaultWake, agent_fault_news, covers
from gpu_efficiency.runtime.scheduler import PolicyRegistry, Scheduler

COVERING: dict[str, Any] = {
    "interval": "60s",
    "metrics": {"nodeAgent": True},
    "selection": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}},
}


def healthy(
    status: str = "True", reason: str = "GPUsHealthy", message: str = "8 GPU(s) fine"
) -> NodeCondition:
    return NodeCondition(names.GPU_HEALTHY, status, reason, message, "2026-01-01T00:00:00Z")


def gpu_node(name: str = "n1", condition: NodeCondition | None = None, pool: str = "gpu") -> NodeView:
    return node(name, labels={"pool": pool}, conditions=() if condition is None else (condition,))


XID_DOWN = healthy("False", "XidCriticalError", "GPU 3 (GPU-n1-3): critical XID 79")


def test_agent_reasons_are_the_agents() -> None:
    assert {nodecondition.XID, nodecondition.DBE, nodecondition.REMAP} == AGENT_FAULT_REASONS


@pytest.mark.parametrize(
    ("before", "after", "news"),
    [
        (healthy(), XID_DOWN, True),
        (None, XID_DOWN, True),
        (XID_DOWN, XID_DOWN, False),  # unchanged (a resync, another field of the node changed)
        (
            XID_DOWN,
            healthy("False", "XidCriticalError", "GPU 3: XID 79; GPU 5: XID 79"),
            True,
        ),  # a second GPU
        (healthy(), healthy("False", "EccDoubleBitError", "GPU 0: 1 double-bit ECC error(s)"), True),
        (XID_DOWN, healthy(), False),  # recovery: the regular cycle handles it
        (healthy(), healthy("False", "GPUFaultXID", "the operator's own"), False),
        (healthy(), healthy("False", "KernelDeadlock", "another detector"), False),
        (healthy(), healthy("Unknown", "NVMLUnavailable", "no NVML"), False),
        (healthy(), None, False),
    ],
)
def test_only_an_agent_fault_report_is_news(
    before: NodeCondition | None, after: NodeCondition | None, news: bool
) -> None:
    assert agent_fault_news(gpu_node(condition=before), gpu_node(condition=after)) is news


def test_covers_needs_faults_the_agent_source_and_a_matching_node() -> None:
    labels = {"pool": "gpu"}
    assert covers(COVERING, labels)
    assert not covers(COVERING, {"pool": "cpu"})
    assert not covers({**COVERING, "metrics": {"nodeAgent": False}}, labels)
    assert not covers({**COVERING, "faults": {"enabled": False}}, labels)
    assert not covers({**COVERING, "mode": "Destroy"}, labels)  # invalid: acts on nothing


def test_min_gap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        FaultWake(0)


def scheduler(min_gap: float = 2.0) -> tuple[Scheduler, PolicyRegistry, FakeRunner, Clock]:
    registry, runner, clock = PolicyRegistry(), FakeRunner(), Clock()
    sched = Scheduler(runner, registry, clock=clock, wake=FaultWake(min_gap, clock=clock))  # type: ignore[arg-type]
    registry.observe("ADDED", body("covering", "2026-01-01T00:00:00Z", spec=COVERING))
    registry.observe(
        "ADDED",
        body(
            "other-pool",
            "2026-01-01T00:01:00Z",
            spec={**COVERING, "selection": {"nodeSelector": {"matchLabels": {"pool": "x"}}}},
        ),
    )
    registry.observe(
        "ADDED",
        body("prometheus-only", "2026-01-01T00:02:00Z", spec={**COVERING, "metrics": {"nodeAgent": False}}),
    )
    assert sched.run_due() == ["covering", "other-pool", "prometheus-only"]  # the first cycles
    clock.now += 1
    assert sched.run_due() == []
    registry.changed.clear()
    return sched, registry, runner, clock


def test_an_agent_fault_runs_only_the_covering_policy_at_once() -> None:
    sched, registry, _, clock = scheduler()
    sched.node_changed(gpu_node(condition=healthy()), gpu_node(condition=XID_DOWN))
    assert registry.changed.is_set()  # the scheduler's loop wakes now, not at its next tick
    assert sched.run_due() == ["covering"]
    clock.now += 1
    assert sched.run_due() == []  # back on its 60 s interval


def test_uncovered_nodes_and_other_writers_wake_nothing() -> None:
    sched, registry, _, _ = scheduler()
    sched.node_changed(gpu_node(condition=healthy(), pool="cpu"), gpu_node(condition=XID_DOWN, pool="cpu"))
    forged = healthy("False", "GPUFaultXID", "written by someone else")
    sched.node_changed(gpu_node(condition=healthy()), gpu_node(condition=forged))
    sched.node_changed(gpu_node(condition=XID_DOWN), gpu_node(condition=XID_DOWN))
    assert not registry.changed.is_set()
    assert sched.run_due() == []


def test_a_flood_coalesces_into_one_cycle_and_early_cycles_keep_the_min_gap() -> None:
    sched, _, runner, clock = scheduler(min_gap=2.0)
    for i in range(50):  # an XID storm over 50 nodes before the scheduler's thread runs
        sched.node_changed(gpu_node(f"n{i}", healthy()), gpu_node(f"n{i}", XID_DOWN))
    assert sched.run_due() == ["covering"]
    early = 1
    for i in range(100):  # the storm goes on: a new node reports every 0.1 s for 10 s
        clock.now += 0.1
        sched.node_changed(gpu_node(f"late-{i}", healthy()), gpu_node(f"late-{i}", XID_DOWN))
        early += len(sched.run_due())
    assert early == 1 + 5  # one at once, then one per 2 s gap, never more often
    assert len(runner.calls) == 3 + early


def test_a_wake_inside_the_gap_is_deferred_not_dropped() -> None:
    sched, _, _, clock = scheduler(min_gap=2.0)
    sched.node_changed(gpu_node("a", healthy()), gpu_node("a", XID_DOWN))
    assert sched.run_due() == ["covering"]
    clock.now += 0.5
    sched.node_changed(gpu_node("b", healthy()), gpu_node("b", XID_DOWN))
    assert sched.run_due() == []
    clock.now += 1.5
    assert sched.run_due() == ["covering"]


def test_the_agents_same_report_again_after_a_recovery_wakes_nothing() -> None:
    """The agent keeps its critical XIDs: after the operator's recovery sets True, the agent writes
    the same False again. No new fault: it must not spend the gap a new one may need."""
    sched, _, _, clock = scheduler()
    sched.node_changed(gpu_node(condition=healthy()), gpu_node(condition=XID_DOWN))
    assert sched.run_due() == ["covering"]
    clock.now += 10
    cleared = healthy(
        "True", "GPUFaultCleared", "no GPU fault is held on this node by gpu-efficiency-operator"
    )
    sched.node_changed(gpu_node(condition=cleared), gpu_node(condition=XID_DOWN))
    assert sched.run_due() == []
    another = healthy("False", "XidCriticalError", "GPU 3: critical XID 79; GPU 5: critical XID 79")
    sched.node_changed(gpu_node(condition=XID_DOWN), gpu_node(condition=another))
    assert sched.run_due() == ["covering"]  # a new GPU in the report: news, and the gap is free


def test_a_deleted_policy_forgets_its_pending_wake() -> None:
    sched, registry, _, _clock = scheduler(min_gap=2.0)
    sched.node_changed(gpu_node("a", healthy()), gpu_node("a", XID_DOWN))
    registry.observe("DELETED", body("covering", "2026-01-01T00:00:00Z", spec=COVERING))
    assert sched.run_due() == []
    assert sched.wake is not None
    assert sched.wake.next_due() is None


def test_without_a_wake_the_scheduler_ignores_node_changes() -> None:
    registry, runner, clock = PolicyRegistry(), FakeRunner(), Clock()
    sched = Scheduler(runner, registry, clock=clock)  # type: ignore[arg-type]
    registry.observe("ADDED", body("covering", "2026-01-01T00:00:00Z", spec=COVERING))
    sched.run_due()
    registry.changed.clear()
    sched.node_changed(gpu_node(condition=healthy()), gpu_node(condition=XID_DOWN))
    assert sched.run_due() == []


def test_a_condition_alone_never_taints_the_samples_decide() -> None:
    """A GPUHealthy=False with the agent's reason (forged, or contradicted by the agent's own data)
    wakes a cycle, and that cycle judges the samples: clean samples, no taint; an XID, a taint."""
    cluster = Cluster.of(gpu_node("n1", XID_DOWN), gpu_node("n2"))
    clean = cluster.cycle([gpu("n1", 3, source="agent"), gpu("n2", source="agent")])
    assert of_type(clean.actions, TaintNode) == []
    faulty = cluster.cycle([gpu("n1", 3, fault=XID_79, source="agent"), gpu("n2", source="agent")])
    assert of_type(faulty.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]
