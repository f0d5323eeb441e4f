"""Straggler quarantine (``stragglers.quarantineHardware``): the node of a hardware straggler gets
the PreferNoSchedule taint and the GPUDegraded condition in Enforce mode only, through the fault
engine (its record, circuit breaker, events), and loses both once the GPU is back at speed.

Each test runs the whole planner (stragglers and faults engines together) and applies its node
and pod writes between cycles, 60 s apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tests.unit.engine import builders as b
from tests.unit.engine.quarantine.support import Cluster
from tests.unit.engine.stragglers.test_outliers import job, slowed, trainer

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    Plan,
    SetNodeCondition,
    Signal,
    Snapshot,
    Stats,
    TaintNode,
    UntaintNode,
)
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.quarantine.kinds import GpuState
from gpu_efficiency.engine.reclaim.activity import DataBounds
from gpu_efficiency.engine.stragglers.evaluate import (
    evaluate_stragglers,
    straggler_judgements,
    straggler_params,
)

THROTTLED = {"clock": 1200.0, "power": 420.0, "CLOCK_EVENTS": b.stats(0x24, 0x64)}
SLOW_GPU = "GPU-train-3-0"


def spec(mode: str = "Enforce", quarantine: bool = True, **fields: Any) -> Any:
    return b.policy(
        mode=mode,
        stragglers={"enabled": True, "for_duration": "2m", "quarantine_hardware": quarantine},
        **fields,
    )


def start(readings: list[Mapping[Signal, Stats]], policy: Any) -> Snapshot:
    gpus, pods = job(readings)
    return b.snapshot(gpus, pods, policy, nodes=[b.node(f"node-{i}") for i in range(len(pods))])


def cycles(snapshot: Snapshot, n: int) -> tuple[Snapshot, list[Plan]]:
    """``n`` cycles with every pod and node write applied; the snapshot after the last."""
    plans = []
    for _ in range(n):
        plan = plan_cycle(snapshot)
        plans.append(plan)
        cluster = Cluster({v.name: v for v in snapshot.nodes}, snapshot.policy, now=snapshot.now)
        cluster.apply(plan.actions)
        snapshot = replace(b.apply_plan(snapshot, plan), nodes=tuple(cluster.nodes.values()))
    return snapshot, plans


def node_writes(plans: list[Plan]) -> list[Any]:
    return [a for p in plans for a in p.actions if isinstance(a, TaintNode | UntaintNode | SetNodeCondition)]


def taints(snapshot: Snapshot, node: str) -> list[str]:
    view = next(n for n in snapshot.nodes if n.name == node)
    return [f"{t.value}:{t.effect}" for t in view.taints if t.key == names.FAULT_TAINT_KEY]


def condition(snapshot: Snapshot, node: str, type_: str) -> tuple[str, str] | None:
    view = next(n for n in snapshot.nodes if n.name == node)
    found = next((c for c in view.conditions if c.type == type_), None)
    return None if found is None else (found.status, found.reason)


def test_enforce_taints_the_hardware_stragglers_node_prefer_no_schedule_and_untaints_on_recovery() -> None:
    snapshot, plans = cycles(start(slowed(**THROTTLED), spec()), 2)
    assert node_writes(plans) == []  # slow, but not for forDuration (2m) yet
    snapshot, plans = cycles(snapshot, 1)
    assert [a for a in node_writes(plans) if isinstance(a, TaintNode)] == [
        TaintNode(node="node-3", kind="straggler", effect="PreferNoSchedule")
    ]
    assert taints(snapshot, "node-3") == ["straggler:PreferNoSchedule"]
    assert condition(snapshot, "node-3", names.GPU_DEGRADED) == ("True", "GPUDegradedStraggler")
    assert condition(snapshot, "node-3", names.GPU_HEALTHY) is None  # slow is not broken
    events = [a for a in plans[0].actions if getattr(a, "reason", "") == names.EV_TAINTED]
    assert events
    assert all("straggler" in a.message for a in events)
    assert all(taints(snapshot, f"node-{i}") == [] for i in range(8) if i != 3)
    # the pod on it is told by the straggler annotation, not also by gpu-fault
    assert not any(names.POD_GPU_FAULT in p.annotations for p in snapshot.pods)

    snapshot, plans = cycles(snapshot, 2)  # still slow: steady, nothing more is written
    assert node_writes(plans[1:]) == []

    recovered = b.with_signals(snapshot, SLOW_GPU, trainer())
    snapshot, plans = cycles(recovered, 2)
    assert UntaintNode(node="node-3", kind="straggler") in node_writes(plans)
    assert taints(snapshot, "node-3") == []
    assert condition(snapshot, "node-3", names.GPU_DEGRADED) == ("False", "GPUDegradedCleared")


def test_observe_mode_never_taints_a_straggler() -> None:
    snapshot, plans = cycles(start(slowed(**THROTTLED), spec(mode="Observe")), 4)
    assert not [a for a in node_writes(plans) if isinstance(a, TaintNode)]
    assert taints(snapshot, "node-3") == []


def test_without_quarantine_hardware_no_node_is_touched() -> None:
    snapshot, plans = cycles(start(slowed(**THROTTLED), spec(quarantine=False)), 4)
    assert node_writes(plans) == []
    assert any(names.STRAGGLER in p.annotations for p in snapshot.pods)  # still reported on the pods


def test_a_straggler_without_a_hardware_cause_is_not_held_against_its_node() -> None:
    """Uneven work (its clocks match its peers') is the job's, not the node's."""
    snapshot, plans = cycles(start(slowed(sm=0.55, tensor=0.3, power=420.0), spec()), 4)
    assert any(names.STRAGGLER in p.annotations for p in snapshot.pods)
    assert node_writes(plans) == []


def test_the_straggler_taint_is_under_the_fault_circuit_breaker() -> None:
    """A budget of zero tainted nodes leaves the straggler's node untainted and opens the breaker."""
    policy = spec(faults={"circuit_breaker": {"max_tainted_nodes": 0}})
    snapshot, plans = cycles(start(slowed(**THROTTLED), policy), 3)
    assert not [a for a in node_writes(plans) if isinstance(a, TaintNode)]
    assert taints(snapshot, "node-3") == []
    assert any(getattr(a, "reason", "") == names.EV_BREAKER for a in plans[-1].actions)


def test_gpus_at_speed_are_judged_only_on_nodes_holding_a_straggler() -> None:
    """A GPU at its group's speed can only release a hold: elsewhere the fault engine needs nothing."""
    snapshot = start(slowed(**THROTTLED), spec())
    gpus, pods = job(slowed(**THROTTLED))
    outcome = evaluate_stragglers(
        snapshot,
        pods,
        straggler_params(snapshot.policy.stragglers, 85.0, 0.0),
        pod_gpus={(p.namespace, p.name): [g for g in gpus if g.node == p.node] for p in pods},
        bounds_of=lambda _: DataBounds(needed=0.0, oldest=0.0),
    )
    every = straggler_judgements(outcome)
    assert {j.node for j in every} == {f"node-{i}" for i in range(8)}
    some = straggler_judgements(outcome, holding={"node-5"})
    assert {(j.node, j.state) for j in some} == {("node-3", GpuState.PENDING), ("node-5", GpuState.HEALTHY)}
