"""Owner-aware reclamation in the planner: all pods idle and due -> one action on the owner."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine import builders as b
from tests.unit.engine.builders import enforce, gpu, no_faults, policy, snapshot  # noqa: F401 (fixture)
from tests.unit.engine.owner_builders import (
    chain,
    due_annotations,
    obj,
    our_record,
    owned,
    with_owners,
    with_records,
)
from tests.unit.positive_control import reached

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    EvictPod,
    OwnerObject,
    Plan,
    PodEvent,
    PodView,
    ReclaimOwner,
    Snapshot,
)
from gpu_efficiency.engine.planner import evaluate, plan_cycle

pytestmark = pytest.mark.usefixtures("no_faults")


def cluster(
    pods: list[PodView],
    objects: list[OwnerObject],
    *,
    busy: frozenset[str] = frozenset(),
    spec: Any = None,
    **owners: Any,
) -> Snapshot:
    gpus = [
        gpu(f"GPU-{p.name}", b.compute_bound() if p.name in busy else b.idle(), (p.namespace, p.name))
        for p in pods
    ]
    return with_owners(snapshot(gpus, pods, spec or enforce()), objects, **owners)


def deployment(
    name: str, replicas: int, namespace: str = "team-a", **top: Any
) -> tuple[list[PodView], list[OwnerObject]]:
    rs = f"{name}-5d9"
    pods = [
        owned(f"{name}-{i}", ("ReplicaSet", rs), namespace, annotations=due_annotations())
        for i in range(replicas)
    ]
    return pods, chain(
        ("ReplicaSet", rs), ("Deployment", name), namespace=namespace, replicas=replicas, **top
    )


def reclaims(actions: tuple[Action, ...]) -> list[str]:
    return [f"{a.action} {a.owner.kind}/{a.owner.name}" for a in actions if isinstance(a, ReclaimOwner)]


def evictions(actions: tuple[Action, ...]) -> list[str]:
    return [f"{a.namespace}/{a.name}" for a in actions if isinstance(a, EvictPod)]


def test_an_idle_deployment_is_scaled_to_zero_not_evicted() -> None:
    pods, objects = deployment("nb", 2)
    plan = plan_cycle(cluster(pods, objects))
    assert reclaims(plan.actions) == ["ScaleToZero Deployment/nb"]
    assert evictions(plan.actions) == []
    action = next(a for a in plan.actions if isinstance(a, ReclaimOwner))
    assert action.pods == (("nb-0", "uid-team-a-nb-0"), ("nb-1", "uid-team-a-nb-1"))
    assert action.policy == "test-policy"
    assert "all 2 GPU pod(s) of deployment/nb idle" in action.reason
    assert plan.actions[-1] is action  # destructive actions last


@pytest.mark.parametrize(
    ("controller", "objects", "expected"),
    [
        (("StatefulSet", "db"), [obj("StatefulSet", "db")], "ScaleToZero StatefulSet/db"),
        (("Job", "train"), [obj("Job", "train")], "Suspend Job/train"),
        (("Job", "w-0"), chain(("Job", "w-0"), ("JobSet", "w")), "Suspend JobSet/w"),
        (("StatefulSet", "lab"), chain(("StatefulSet", "lab"), ("Notebook", "lab")), "Stop Notebook/lab"),
    ],
)
def test_each_kind_gets_its_action(
    controller: tuple[str, str], objects: list[OwnerObject], expected: str
) -> None:
    pods = [owned("p", controller, annotations=due_annotations())]
    assert reclaims(plan_cycle(cluster(pods, objects)).actions) == [expected]


def test_a_bare_pod_is_evicted_only_when_allowed() -> None:
    pods = [owned("solo", None, annotations=due_annotations())]
    assert evictions(plan_cycle(cluster(pods, [])).actions) == []
    allowed = enforce(eviction={"allow_bare_pods": True})
    assert evictions(plan_cycle(cluster(pods, [], spec=allowed)).actions) == ["team-a/solo"]


def test_a_partly_idle_deployment_is_never_scaled_and_gets_the_recommendation() -> None:
    pods, objects = deployment("web", 3)
    plan = plan_cycle(cluster(pods, objects, busy=frozenset({"web-2"})))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    patches = {a.name: a.annotations for a in plan.actions if isinstance(a, AnnotatePod)}
    for name in ("web-0", "web-1"):
        assert (
            patches[name][names.RECOMMENDATION] == "2 of 3 replicas idle: reduce replicas of deployment/web"
        )
        assert patches[name][names.EVICT_AFTER] is None  # the warning that cannot come true is withdrawn
    skipped = [a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_RECLAIM_SKIPPED]
    assert sorted(e.name for e in skipped) == ["web-0", "web-1"]


def test_budgets_count_owners_not_pods() -> None:
    first, o1 = deployment("a", 3)
    second, o2 = deployment("b", 3)
    third, o3 = deployment("c", 1, namespace="team-b")
    spec = enforce(eviction={"max_per_cycle": 2, "max_per_namespace_per_cycle": 1})
    plan = plan_cycle(cluster(first + second + third, o1 + o2 + o3, spec=spec))
    assert sorted(reclaims(plan.actions)) == ["ScaleToZero Deployment/a", "ScaleToZero Deployment/c"]
    assert any("maxPerNamespacePerCycle 1" in n and "deployment/b" in n for n in plan.notes)


def test_the_hour_budget_counts_earlier_reclaims() -> None:
    pods, objects = deployment("a", 2)
    spec = enforce(eviction={"max_per_hour": 1})
    status = b.GPUEfficiencyPolicyStatus(recent_evictions=[b.format_rfc3339(b.NOW - 60)])
    snap = with_owners(
        snapshot(
            [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods], pods, spec, status=status
        ),
        objects,
    )
    assert reclaims(plan_cycle(snap).actions) == []


def test_explain_says_the_hour_budget_holds_the_pods_owner() -> None:
    from gpu_efficiency.engine.planner import explain_pod

    pods, objects = deployment("nb", 2)
    spec = enforce(eviction={"max_per_hour": 1})
    status = b.GPUEfficiencyPolicyStatus(recent_evictions=[b.format_rfc3339(b.NOW - 60)])
    gpus = [gpu(f"GPU-{p.name}", b.idle(), (p.namespace, p.name)) for p in pods]
    snap = with_owners(snapshot(gpus, pods, spec, status=status), objects)
    text = "\n".join(explain_pod(snap, "team-a", "nb-1"))
    assert (
        "note: team-a/deployment/nb: reclaim postponed: maxPerHour 1 reached (1 in the last hour)" in text
    ), text


def test_observe_mode_shows_the_owner_and_action_and_acts_on_nothing() -> None:
    pods, objects = deployment("nb", 1)
    plan = plan_cycle(cluster(pods, objects, spec=policy()))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    assert "team-a/nb-0: owner deployment/nb, action ScaleToZero, 1 of 1 GPU pod(s) idle" in plan.notes


def test_the_warning_names_the_owner_action() -> None:
    pods = [
        owned("nb-0", ("ReplicaSet", "nb-1"), annotations={names.IDLE_SINCE: b.format_rfc3339(b.NOW - 3600)})
    ]
    plan = plan_cycle(cluster(pods, chain(("ReplicaSet", "nb-1"), ("Deployment", "nb"))))
    warning = next(
        a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_SCHEDULED
    )
    assert "deployment/nb will be scaled to zero after" in warning.message


def test_an_owner_already_reclaimed_is_not_acted_on_again() -> None:
    pods, _ = deployment("nb", 1)
    objects = chain(
        ("ReplicaSet", "nb-5d9"),
        ("Deployment", "nb"),
        replicas=0,
        annotations={names.RECLAIMED: "ScaleToZero"},
    )
    plan = plan_cycle(with_records(cluster(pods, objects), our_record("Deployment", "nb")))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    assert any("already reclaimed" in n for n in plan.notes)


def test_a_decoy_owner_with_a_forged_reclaimed_annotation_does_not_hold_its_idle_pods() -> None:
    """Issue 32's escape: a pod whose controller is a Deployment at 0 replicas carrying our
    annotation, but which our status never recorded, is not 'already reclaimed': it is acted on."""
    pods, _ = deployment("nb", 1)
    objects = chain(
        ("ReplicaSet", "nb-5d9"),
        ("Deployment", "nb"),
        replicas=0,
        annotations={names.RECLAIMED: "ScaleToZero"},
    )
    plan = plan_cycle(cluster(pods, objects))
    assert not any("already reclaimed" in n for n in plan.notes)
    assert reclaims(plan.actions) or evictions(plan.actions)  # acted on (how: the owner kind's rule)


def test_owners_unreadable_holds_without_withdrawing_warnings() -> None:
    pods, _ = deployment("nb", 1)
    plan = plan_cycle(cluster(pods, [], error="HTTP 500"))
    assert reclaims(plan.actions) == []
    assert evictions(plan.actions) == []
    patches = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    assert all(names.EVICT_AFTER not in p for p in patches)


def test_an_exempt_replica_holds_its_whole_owner() -> None:
    pods, objects = deployment("nb", 2)
    pods[1] = b.replace(
        pods[1], annotations={**pods[1].annotations, names.KEEP_UNTIL: b.format_rfc3339(b.NOW + 3600)}
    )
    plan = plan_cycle(cluster(pods, objects))
    assert reclaims(plan.actions) == []
    patches = {a.name: a.annotations for a in plan.actions if isinstance(a, AnnotatePod)}
    assert patches["nb-0"][names.EVICT_AFTER] is None


def test_an_owner_waits_until_every_pod_is_due() -> None:
    pods, objects = deployment("nb", 2)
    later = {
        names.IDLE_SINCE: b.format_rfc3339(b.NOW - 1800),
        names.EVICT_AFTER: b.format_rfc3339(b.NOW + 60),
    }
    pods[1] = b.replace(pods[1], annotations=later)
    plan = plan_cycle(cluster(pods, objects))
    assert reclaims(plan.actions) == []
    assert any("1 of 2 GPU pods of deployment/nb due" in n for n in plan.notes)


def test_a_pod_of_the_owner_outside_the_policy_holds_it() -> None:
    pods, objects = deployment("nb", 2, namespace="team-a")
    spec = enforce(selection={"pod_selector": {"match_labels": {"judge": "me"}}})
    pods = [b.replace(pods[0], labels={"judge": "me"}), pods[1]]
    assert reclaims(plan_cycle(cluster(pods, objects, spec=spec)).actions) == []


def test_explain_shows_owner_and_action() -> None:
    pods, objects = deployment("nb", 1)
    record = evaluate(cluster(pods, objects), focus=("team-a", "nb-0")).record
    assert record is not None
    assert record.owner.startswith("owner deployment/nb, action ScaleToZero")


# ---- property: no owner with a pod that is not idle is ever reclaimed ----------------------------

PROFILES = {"idle": b.idle, "busy": b.compute_bound, "bursty": b.bursty_inference}
KINDS = [
    ("Deployment", lambda n: [("ReplicaSet", f"{n}-rs"), ("Deployment", n)]),
    ("StatefulSet", lambda n: [("StatefulSet", n)]),
    ("Job", lambda n: [("Job", n)]),
    ("JobSet", lambda n: [("Job", f"{n}-0"), ("JobSet", n)]),
    ("Notebook", lambda n: [("StatefulSet", n), ("Notebook", n)]),
    ("Pod", lambda n: []),
]
owner_specs = st.lists(
    st.tuples(
        st.integers(0, len(KINDS) - 1),
        st.lists(
            st.tuples(st.sampled_from([*sorted(PROFILES), "missing"]), st.booleans()), min_size=1, max_size=4
        ),
        st.sampled_from(["ns1", "ns2"]),
    ),
    min_size=1,
    max_size=6,
)


OwnerSpecs = list[tuple[int, list[tuple[str, bool]], str]]


def _owners_plan(specs: OwnerSpecs, bare_allowed: bool, idle_for: str) -> tuple[Plan, set[tuple[str, str]]]:
    """The plan for the drawn owners, and the owners with a pod that is not idle."""
    pods: list[PodView] = []
    objects: list[OwnerObject] = []
    gpus = []
    not_idle: set[tuple[str, str]] = set()  # (namespace, owner name)
    for i, (kind_index, members, namespace) in enumerate(specs):
        _, links = KINDS[kind_index]
        name = f"o{i}"
        chain_links = links(name)
        objects += chain(*chain_links, namespace=namespace) if chain_links else []
        for j, (profile, due) in enumerate(members):
            pod_name = f"{name}-{j}" if chain_links else name
            annotations = due_annotations() if due else {}
            pods.append(
                owned(pod_name, chain_links[0] if chain_links else None, namespace, annotations=annotations)
            )
            if profile != "missing":
                gpus.append(gpu(f"GPU-{namespace}-{pod_name}", PROFILES[profile](), (namespace, pod_name)))
            if profile != "idle":
                not_idle.add((namespace, name))
            if not chain_links:
                break  # a bare pod is one pod
    spec = enforce(idle={"idle_for": idle_for}, eviction={"allow_bare_pods": bare_allowed})
    return plan_cycle(with_owners(snapshot(gpus, pods, spec), objects)), not_idle


@settings(max_examples=150, deadline=None)
@given(owner_specs, st.booleans(), st.sampled_from(["0s", "5m"]))
def test_no_owner_with_a_pod_that_is_not_idle_is_ever_reclaimed(
    specs: OwnerSpecs, bare_allowed: bool, idle_for: str
) -> None:
    plan, not_idle = _owners_plan(specs, bare_allowed, idle_for)
    for action in plan.actions:
        if isinstance(action, ReclaimOwner):
            assert (action.namespace, action.owner.name) not in not_idle
        elif isinstance(action, EvictPod):
            owner = action.name.rsplit("-", 1)[0] if "-" in action.name else action.name
            assert (action.namespace, owner) not in not_idle


def test_control_owners_are_reclaimed_beside_partly_idle_ones() -> None:
    """The property above also holds if nothing is ever reclaimed: its generator must reach a plan
    that reclaims an owner while another owner with a pod that is not idle is left alone."""

    def reclaims_beside_busy(case: tuple[OwnerSpecs, bool, str]) -> bool:
        plan, not_idle = _owners_plan(*case)
        return bool(not_idle) and any(isinstance(a, ReclaimOwner) for a in plan.actions)

    reached(st.tuples(owner_specs, st.booleans(), st.sampled_from(["0s", "5m"])), reclaims_beside_busy)


def test_explain_prints_the_owner_and_the_reclaim() -> None:
    from gpu_efficiency.engine.planner import explain_pod

    pods, objects = deployment("nb", 1)
    text = "\n".join(explain_pod(cluster(pods, objects), "team-a", "nb-0"))
    assert "owner deployment/nb, action ScaleToZero, 1 of 1 GPU pod(s) idle" in text
    assert "SCALETOZERO deployment/nb: all 1 GPU pod(s) of deployment/nb idle since" in text


def test_the_report_lists_owner_actions_and_the_owners_of_idle_pods() -> None:
    from gpu_efficiency.report import build_report, render_table

    pods, objects = deployment("nb", 1)
    partial, partial_objects = deployment("web", 2)
    snap = cluster(pods + partial, objects + partial_objects, busy=frozenset({"web-1"}))
    report = build_report(snap, plan_cycle(snap))
    assert {"pod": "team-a/deployment/nb", "action": "ScaleToZero"}.items() <= report["actions"][0].items()
    table = render_table(report)
    assert "1 of 2 replicas idle: reduce replicas of deployment/web" in table
    assert "ScaleToZero  team-a/deployment/nb: all 1 GPU pod(s)" in table


def test_a_disruption_budget_holds_a_scale_down_and_says_so_once() -> None:
    from gpu_efficiency.api.policy import LabelSelector
    from gpu_efficiency.engine.model import DisruptionBudget

    pods, objects = deployment("guarded", 1)
    pods = [b.replace(p, labels={"app": "guarded"}) for p in pods]
    guard = DisruptionBudget("team-a", "guard", LabelSelector(match_labels={"app": "guarded"}), 0)
    snap = b.replace(cluster(pods, objects), disruption_budgets=(guard,))
    plan = plan_cycle(snap)
    assert reclaims(plan.actions) == []
    blocked = [a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_BLOCKED]
    assert len(blocked) == 1
    assert "PodDisruptionBudget guard allows 0 disruption(s)" in blocked[0].message
    assert any(isinstance(a, AnnotatePod) and names.EVICTION_BLOCKED in a.annotations for a in plan.actions)
    # recorded once: the next cycle retries quietly
    marked = [
        b.replace(p, annotations={**p.annotations, names.EVICTION_BLOCKED: "2023-11-14T22:13:20Z"})
        for p in pods
    ]
    again = plan_cycle(b.replace(snap, pods=tuple(marked)))
    assert not [a for a in again.actions if isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_BLOCKED]
    assert reclaims(again.actions) == []
    # a budget that allows the disruption, or one of another namespace, holds nothing
    enough = b.replace(guard, disruptions_allowed=1)
    assert reclaims(plan_cycle(b.replace(snap, disruption_budgets=(enough,))).actions) == [
        "ScaleToZero Deployment/guarded"
    ]
    elsewhere = b.replace(guard, namespace="team-b")
    assert reclaims(plan_cycle(b.replace(snap, disruption_budgets=(elsewhere,))).actions) == [
        "ScaleToZero Deployment/guarded"
    ]
