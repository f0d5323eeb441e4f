"""Overlapping policies: the senior one (created earlier) judges a pod or node; the others skip it."""

from dataclasses import replace

import pytest

from gpu_efficiency.api.policy import LabelSelector, Selection
from gpu_efficiency.engine.model import AnnotatePod, SeniorPolicy
from gpu_efficiency.engine.planner import explain_pod, plan_cycle
from gpu_efficiency.engine.quarantine.evaluate import in_scope_nodes
from tests.unit.engine import builders as b
from tests.unit.engine.builders import enforce, gpu, no_faults, node, pod, snapshot  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("no_faults")

EVERYTHING = Selection()
TEAM_B_ONLY = Selection(pod_selector=LabelSelector(match_labels={"team": "b"}))


@pytest.mark.parametrize(("senior", "judged"), [(None, True), (EVERYTHING, False), (TEAM_B_ONLY, True)])
def test_pod_claimed_by_a_senior_policy_is_skipped(senior: Selection | None, judged: bool) -> None:
    p = pod("p", labels={"team": "a"})
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [p], enforce())
    if senior is not None:
        snap = replace(snap, senior_policies=(SeniorPolicy("older", senior, faults_enabled=True),))
    plan = plan_cycle(snap)
    assert bool(plan.verdicts) is judged
    assert bool([a for a in plan.actions if isinstance(a, AnnotatePod)]) is judged
    if not judged:
        assert any("judged by policy older" in line for line in explain_pod(snap, "team-a", "p"))


def test_nodes_of_a_senior_fault_policy_are_skipped() -> None:
    nodes = [node("a", {"pool": "x"}), node("b", {"pool": "y"})]
    snap = snapshot([], [], enforce(), nodes=nodes)
    assert [n.name for n in in_scope_nodes(snap)] == ["a", "b"]
    x_only = Selection(node_selector=LabelSelector(match_labels={"pool": "x"}))
    claimed = replace(snap, senior_policies=(SeniorPolicy("older", x_only, faults_enabled=True),))
    assert [n.name for n in in_scope_nodes(claimed)] == ["b"]
    no_faults_senior = replace(snap, senior_policies=(SeniorPolicy("older", x_only, faults_enabled=False),))
    assert [n.name for n in in_scope_nodes(no_faults_senior)] == ["a", "b"]
