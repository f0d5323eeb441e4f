"""Warm-up: a pod younger than minPodAge (default the window) gets no verdict and no idle clock,
because the window's per-GPU samples may still be the previous tenant's."""

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotatePod, PodEvent, Verdict
from gpu_efficiency.engine.planner import plan_cycle

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


def test_a_warming_up_pod_is_told_so_and_until_when() -> None:
    young = pod("p", start_time=NOW - 60)  # the default window, and so minPodAge, is 10m
    plan = plan_cycle(snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [young], enforce()))
    (patch,) = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    recommendation = patch[names.RECOMMENDATION]
    assert recommendation is not None
    assert recommendation.startswith("warming up: judged from 2023-11-14T22:22:20Z")  # NOW - 60 + 600
    assert "dcgm-exporter" not in recommendation
    assert patch[names.DIAGNOSIS] == "insufficient-data"


def test_once_warm_a_pod_without_samples_is_told_there_is_nothing_to_do() -> None:
    """The warming-up text does not outlive the warm-up: a pod still without a diagnosis gets the
    recommendation of its new reason, which asks nothing of the pod's owner (fixing the exporter is
    the admins' task)."""
    warming = "warming up: judged from 2023-11-14T22:22:20Z, once it has run 10m"
    grown = pod(
        "p",
        annotations={
            names.STATE: "Unknown",
            names.DIAGNOSIS: "insufficient-data",
            names.RECOMMENDATION: warming,
        },
    )
    plan = plan_cycle(snapshot([gpu("GPU-0", b.idle(), ("team-a", "other"))], [grown], enforce()))
    (patch,) = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    assert (patch[names.RECOMMENDATION] or "").startswith("nothing to do: there are no usable GPU metrics")
    assert "dcgm-exporter" not in (patch[names.RECOMMENDATION] or "")
