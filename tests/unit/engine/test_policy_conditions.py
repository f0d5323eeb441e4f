"""Policy conditions say the truth: PolicyValid turns True once the spec parses, every condition
carries the generation it was computed from, and a policy whose pods an older one judges says so."""

from dataclasses import replace

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import LabelSelector, Selection
from gpu_efficiency.api.status import Condition, GPUEfficiencyPolicyStatus
from gpu_efficiency.engine.conditions import find_condition
from gpu_efficiency.engine.model import PolicyEvent, SeniorPolicy, Snapshot
from gpu_efficiency.engine.planner import plan_cycle
from tests.unit.engine import builders as b
from tests.unit.engine.builders import apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("no_faults")


def _condition(status: GPUEfficiencyPolicyStatus, type_: str) -> Condition:
    found = find_condition(status.conditions, type_)
    assert found is not None, f"no {type_} condition in {status.conditions}"
    return found


def test_policy_valid_turns_true_once_the_spec_is_fixed() -> None:
    invalid = Condition(
        type=names.COND_VALID, status="False", reason="InvalidSpec", message="bad", observed_generation=1
    )
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [pod("p")], enforce())
    fixed = replace(snap, generation=2, status=GPUEfficiencyPolicyStatus(conditions=[invalid]))
    valid = _condition(plan_cycle(fixed).status, names.COND_VALID)
    assert (valid.status, valid.reason, valid.observed_generation) == ("True", "Valid", 2)


@pytest.mark.parametrize("metrics_available", [True, False])
def test_every_condition_carries_the_generation_of_the_cycle(metrics_available: bool) -> None:
    old = Condition(type="NotificationsHealthy", status="True", reason="Sent", observed_generation=3)
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [pod("p")], enforce())
    snap = replace(
        snap,
        generation=7,
        metrics_available=metrics_available,
        status=GPUEfficiencyPolicyStatus(conditions=[old]),
    )
    conditions = plan_cycle(snap).status.conditions
    assert {c.type for c in conditions} >= {names.COND_READY, names.COND_METRICS, names.COND_VALID}
    assert {c.observed_generation for c in conditions} == {7}


def _overlapping(senior_selection: Selection) -> Snapshot:
    pods = [pod("a1", labels={"team": "a"}), pod("a2", labels={"team": "a"}), pod("b1", labels={"team": "b"})]
    gpus = [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    snap = snapshot(gpus, pods, enforce())
    return replace(snap, senior_policies=(SeniorPolicy("older", senior_selection, faults_enabled=False),))


TEAM_A = Selection(pod_selector=LabelSelector(match_labels={"team": "a"}))
TEAM_C = Selection(pod_selector=LabelSelector(match_labels={"team": "c"}))


def _shadow_events(actions: tuple[object, ...]) -> list[PolicyEvent]:
    return [a for a in actions if isinstance(a, PolicyEvent) and a.reason == names.EV_POLICY_SHADOWED]


def test_a_shadowed_policy_names_the_winner_and_the_pods_it_loses_with_one_event() -> None:
    snap = _overlapping(TEAM_A)
    first = plan_cycle(snap)
    shadowed = _condition(first.status, names.COND_SHADOWED)
    assert shadowed.status == "True"
    assert "older (2 pods)" in shadowed.message
    assert first.status.pods_evaluated == 1
    [event] = _shadow_events(first.actions)
    assert event.type == "Warning"
    assert "older (2 pods)" in event.message
    # The same overlap next cycle: no second event.
    second = plan_cycle(apply_plan(snap, first))
    assert _condition(second.status, names.COND_SHADOWED).status == "True"
    assert _shadow_events(second.actions) == []


def test_a_new_winner_is_a_change_worth_an_event() -> None:
    snap = _overlapping(TEAM_A)
    first = plan_cycle(snap)
    other = SeniorPolicy("other", Selection(), faults_enabled=False)
    next_snap = replace(apply_plan(snap, first), senior_policies=(other,))
    [event] = _shadow_events(plan_cycle(next_snap).actions)
    assert "other (3 pods)" in event.message


def test_no_overlap_is_shadowed_false() -> None:
    plan = plan_cycle(_overlapping(TEAM_C))
    assert _condition(plan.status, names.COND_SHADOWED).status == "False"
    assert _shadow_events(plan.actions) == []
