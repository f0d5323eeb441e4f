"""Forged metric series (issue 19, finding 1): one tenant's series never evict or taint another's.

Safety rule 9: a sample counts for a pod only if its node agrees with the pod's real node, a fault
only for a GPU the node can have, and one signal never overrides a contradicting one into Idle.
"""

from __future__ import annotations

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.engine.activity import CONTRADICTING, data_bounds, gpu_activity
from gpu_efficiency.engine.model import EvictPod, Signal, Verdict
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import evaluate, explain_pod
from gpu_efficiency.engine.timefmt import format_rfc3339

from .builders import NOW, compute_bound, enforce, gpu, idle, pod, snapshot, stats

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
