"""Warm-up: a pod younger than minPodAge (default the window) gets no verdict and no idle clock,
because the window's per-GPU samples may still be the previous tenant's."""

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotatePod, PodEvent, Verdict
from gpu_efficiency.engine.planner import plan_cycle

from . import builders as b
from .builders import NOW, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("no_faults")


@pytest.mark.parametrize(
    ("age", "expected"), [(30, Verdict.UNKNOWN), (599, Verdict.UNKNOWN), (601, Verdict.IDLE)]
)
def test_young_pod_on_idle_gpu_waits_for_a_full_window(age: float, expected: Verdict) -> None:
    young = pod("p", start_time=NOW - age)  # the default window is 10m
    plan = plan_cycle(snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [young], enforce()))
    (verdict,) = plan.verdicts
    assert verdict.verdict is expected
    patches = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    idle_since_set = any(names.IDLE_SINCE in p for p in patches)
    assert idle_since_set is (expected is Verdict.IDLE)
    if expected is Verdict.UNKNOWN:
        assert "warming up" in verdict.reason
        assert not [a for a in plan.actions if isinstance(a, PodEvent)]


def test_min_pod_age_sets_the_warm_up() -> None:
    young = pod("p", start_time=NOW - 90)
    plan = plan_cycle(
        snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [young], enforce(eviction={"min_pod_age": "1m"}))
    )
    assert plan.verdicts[0].verdict is Verdict.IDLE
