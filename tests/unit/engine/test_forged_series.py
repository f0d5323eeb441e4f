"""Forged metric series (issue 19, finding 1): one tenant's series never evict or taint another's.

Safety rule 8: a sample counts for a pod only if its node agrees with the pod's real node, a fault
only for a GPU the node can have, and one signal never overrides a contradicting one into Idle.
"""

from __future__ import annotations

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import EvictPod, GPUSample, Signal, Snapshot, TaintNode, Verdict
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import evaluate, explain_pod
from gpu_efficiency.engine.reclaim.activity import CONTRADICTING, data_bounds, gpu_activity
from gpu_efficiency.engine.trust import DropReason
from tests.unit.engine.builders import NOW, compute_bound, enforce, gpu, idle, pod, snapshot, stats
from tests.unit.engine.quarantine.support import XID_79
from tests.unit.engine.quarantine.support import gpu as fault_gpu
from tests.unit.engine.quarantine.support import node as fault_node
from tests.unit.engine.quarantine.support import policy as fault_policy

PAST = format_rfc3339(NOW - 3600)
#: A pod whose idle clock and warning have run out: Idle now means an eviction this cycle.
DUE = {names.IDLE_SINCE: PAST, names.EVICT_AFTER: PAST}


def test_forged_sm_active_zero_on_a_busy_gpu_is_not_idle_and_not_evicted() -> None:
    signals = compute_bound() | {Signal.SM_ACTIVE: stats(0.0, 0.0), Signal.GPU_UTIL: stats(99.0, 100.0)}
    snap = snapshot([gpu("GPU-0", signals, ("team-a", "busy"))], [pod("busy", annotations=DUE)], enforce())
    plan = evaluate(snap).plan
    (verdict,) = plan.verdicts
    assert verdict.verdict is not Verdict.IDLE
    assert CONTRADICTING in verdict.reason
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    assert any(CONTRADICTING in line for line in explain_pod(snap, "team-a", "busy"))


def test_gr_engine_zero_under_high_gpu_util_is_a_contradiction_too() -> None:
    signals = {Signal.GR_ENGINE_ACTIVE: stats(0.0, 0.0), Signal.GPU_UTIL: stats(99.0, 100.0)}
    sample = gpu("GPU-0", signals, ("team-a", "busy"))
    found = gpu_activity(sample, data_bounds(sample, cycle_params(enforce()), NOW))
    assert not found.known
    assert found.unknown_reason.startswith(CONTRADICTING)


@pytest.mark.parametrize(
    ("sm_avg", "util", "contradicts"),
    [
        (0.0, 99.0, True),  # no warp anywhere while kernels ran all the time
        (0.0076, 99.0, False),  # one warp on one of an H100's 132 SMs: fake load, physically possible
        (0.0, 30.0, False),  # GPU_UTIL too low to contradict across two samplers
        (0.0, 0.0, False),  # an idle GPU: both agree
    ],
)
def test_the_contradiction_follows_the_physical_bound(sm_avg: float, util: float, contradicts: bool) -> None:
    signals = {Signal.SM_ACTIVE: stats(sm_avg), Signal.GPU_UTIL: stats(util)}
    sample = gpu("GPU-0", signals, ("team-a", "p"))
    found = gpu_activity(sample, data_bounds(sample, cycle_params(enforce()), NOW))
    assert (not found.known and found.unknown_reason.startswith(CONTRADICTING)) is contradicts


def test_a_truly_idle_gpu_is_still_idle_and_evicted() -> None:
    snap = snapshot([gpu("GPU-0", idle(), ("team-a", "idle"))], [pod("idle", annotations=DUE)], enforce())
    plan = evaluate(snap).plan
    assert plan.verdicts[0].verdict is Verdict.IDLE
    assert [a for a in plan.actions if isinstance(a, EvictPod)]


def test_a_pod_label_on_a_gpu_of_another_node_does_not_count() -> None:
    """A forged idle GPU on node-1 names a pod that runs on node-0: the pod gets no samples from it."""
    forged = gpu("GPU-9", idle(), ("team-a", "victim"), node="node-1")
    snap = snapshot([forged], [pod("victim", node="node-0", annotations=DUE)], enforce())
    plan = evaluate(snap).plan
    (verdict,) = plan.verdicts
    assert verdict.verdict is Verdict.UNKNOWN
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    assert plan.status.dropped_samples == {DropReason.POD_NODE_MISMATCH: 1}


def test_the_pods_own_node_still_counts() -> None:
    own = gpu("GPU-0", idle(), ("team-a", "idle"), node="node-0")
    plan = evaluate(snapshot([own], [pod("idle", node="node-0", annotations=DUE)], enforce())).plan
    assert plan.verdicts[0].verdict is Verdict.IDLE
    assert plan.status.dropped_samples == {}


def _fault_snapshot(*gpus: GPUSample, capacity: int = 2) -> Snapshot:
    nodes = [fault_node("n1", gpus=capacity)]
    return snapshot(gpus, [], fault_policy("Enforce"), nodes=nodes, dropped={DropReason.NODE_CONFLICT: 1})


def test_a_forged_xid_on_a_gpu_the_node_cannot_have_taints_nothing() -> None:
    """n1 has 2 GPUs, both reported healthy; a third, invented UUID reports XID 79 on n1."""
    snap = _fault_snapshot(fault_gpu("n1", 0), fault_gpu("n1", 1), fault_gpu("n1", 7, fault=XID_79))
    plan = evaluate(snap).plan
    assert not [a for a in plan.actions if isinstance(a, TaintNode)]
    assert plan.status.dropped_samples == {DropReason.GPUS_EXCEED_CAPACITY: 3, DropReason.NODE_CONFLICT: 1}
    metrics = next(c for c in plan.status.conditions if c.type == names.COND_METRICS)
    assert "dropped as untrustworthy: gpus-exceed-capacity 3, node-conflict 1" in metrics.message


def test_a_real_xid_on_a_fully_reported_node_still_taints() -> None:
    plan = evaluate(_fault_snapshot(fault_gpu("n1", 0), fault_gpu("n1", 1, fault=XID_79))).plan
    assert [a for a in plan.actions if isinstance(a, TaintNode)] == [
        TaintNode(node="n1", kind="xid", effect="NoSchedule")
    ]
