"""reclaimWhen OnPressure's fit: the fewest due owners whose GPUs make waiting GPU pods fit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine.builders import pod
from tests.unit.positive_control import reached

from gpu_efficiency.engine.model import (
    NodeRequirement,
    NodeView,
    OwnerKey,
    PendingPod,
    PodView,
    Taint,
    Toleration,
)
from gpu_efficiency.engine.reclaim.pressure import choose_for_pressure, free_gpus, may_run_on

INSUFFICIENT = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available"


def gpu_node(name: str, gpus: int = 8, labels: Mapping[str, str] | None = None, **fields: object) -> NodeView:
    view = NodeView(name, dict(labels or {}), {}, (), (), gpus)
    return replace(view, **fields)  # type: ignore[arg-type]


def waiting(name: str = "w", gpus: int = 2, **fields: object) -> PendingPod:
    view = PendingPod("batch", name, f"uid-{name}", gpus, 0, 1.0, {}, (), (), "Unschedulable", INSUFFICIENT)
    return replace(view, **fields)  # type: ignore[arg-type]


def owner(name: str) -> OwnerKey:
    return ("team-a", "Deployment", name)


def busy(node: str, gpus: int, name: str = "busy") -> PodView:
    return pod(f"{name}-{node}", "other", node=node, gpu_request=gpus)


def test_nothing_is_chosen_while_nothing_waits_for_gpus() -> None:
    nodes = [gpu_node("n1", 2)]
    held = [pod("idle", node="n1", gpu_request=2)]
    offers = {owner("idle"): {"n1": 2}}
    assert choose_for_pressure(nodes, held, [], offers).chosen == ()
    other_reason = waiting(scheduled_message="0/2 nodes are available: 2 Insufficient cpu.")
    assert choose_for_pressure(nodes, held, [other_reason], offers).chosen == ()
    no_condition = waiting(scheduled_reason="", scheduled_message="")
    assert choose_for_pressure(nodes, held, [no_condition], offers).chosen == ()


def test_exactly_enough_owners_for_a_two_gpu_pod_and_no_more() -> None:
    nodes = [gpu_node("n1", 4)]
    held = [pod(f"nb{i}", node="n1", gpu_request=1) for i in range(4)]
    offers = {owner(f"nb{i}"): {"n1": 1} for i in range(4)}
    choice = choose_for_pressure(nodes, held, [waiting(gpus=2)], offers)
    assert choice.chosen == (owner("nb0"), owner("nb1"))  # the two longest idle (offer order)
    assert choice.served == {owner("nb0"): ("batch/w",), owner("nb1"): ("batch/w",)}


def test_the_smallest_owner_that_covers_the_deficit_is_chosen() -> None:
    nodes = [gpu_node("n1", 8)]
    held = [pod("big", node="n1", gpu_request=4), pod("two", node="n1", gpu_request=2),
            pod("one", node="n1", gpu_request=1), busy("n1", 1)]  # fmt: skip
    offers = {owner("big"): {"n1": 4}, owner("two"): {"n1": 2}, owner("one"): {"n1": 1}}
    assert choose_for_pressure(nodes, held, [waiting(gpus=2)], offers).chosen == (owner("two"),)


def test_a_pod_that_fits_in_free_gpus_gets_nothing_reclaimed_nor_do_pods_being_freed() -> None:
    nodes = [gpu_node("n1", 4)]
    offers = {owner("nb"): {"n1": 2}}
    held = [pod("nb", node="n1", gpu_request=2)]
    assert choose_for_pressure(nodes, held, [waiting(gpus=2)], offers).chosen == ()
    leaving = [pod("nb", node="n1", gpu_request=2), pod("gone", node="n1", gpu_request=2, deleting=True)]
    assert choose_for_pressure(nodes, leaving, [waiting(gpus=2)], offers).chosen == ()
    reclaimed = [pod("nb", node="n1", gpu_request=2), pod("old", node="n1", gpu_request=2)]
    assert (
        choose_for_pressure(nodes, reclaimed, [waiting(gpus=2)], offers, frozenset({"uid-team-a-old"})).chosen
        == ()
    )


def test_the_second_waiting_pod_gets_what_the_first_left_and_more_only_if_needed() -> None:
    nodes = [gpu_node("n1", 4)]
    held = [pod("a", node="n1", gpu_request=3), pod("b", node="n1", gpu_request=1)]
    offers = {owner("a"): {"n1": 3}, owner("b"): {"n1": 1}}
    first, second = waiting("first", 2, created=1.0), waiting("second", 1, created=2.0)
    choice = choose_for_pressure(nodes, held, [second, first], offers)
    assert choice.chosen == (owner("a"),)  # 3 freed: 2 for the first, 1 left for the second
    assert choice.served == {owner("a"): ("batch/first",)}


def test_node_selector_affinity_and_taints_are_respected() -> None:
    plain = gpu_node("plain", 2)
    a100 = gpu_node("a100", 2, {"gpu": "a100"})
    tainted = gpu_node("tainted", 2, {"gpu": "a100"}, taints=(Taint("dedicated", "ml", "NoSchedule"),))
    nodes = [plain, a100, tainted]
    held = [pod(f"nb-{n.name}", node=n.name, gpu_request=2) for n in nodes]
    offers = {owner(f"nb-{n.name}"): {n.name: 2} for n in nodes}
    selector = waiting(node_selector={"gpu": "a100"})
    assert choose_for_pressure(nodes, held, [selector], offers).chosen == (owner("nb-a100"),)
    tolerant = replace(selector, tolerations=(Toleration("dedicated", "Equal", "ml", "NoSchedule"),))
    only_tainted = {owner("nb-tainted"): {"tainted": 2}}
    assert choose_for_pressure(nodes, held, [tolerant], only_tainted).chosen == (owner("nb-tainted"),)
    assert choose_for_pressure(nodes, held, [selector], only_tainted).chosen == ()  # taint not tolerated
    not_a100 = waiting(affinity_terms=((NodeRequirement("gpu", "NotIn", ("a100",)),),))
    assert choose_for_pressure(nodes, held, [not_a100], offers).chosen == (owner("nb-plain"),)
    by_name = waiting(affinity_terms=((NodeRequirement("metadata.name", "In", ("a100",), field=True),),))
    assert choose_for_pressure(nodes, held, [by_name], offers).chosen == (owner("nb-a100"),)
    cordoned = replace(a100, unschedulable=True)
    assert not may_run_on(selector, cordoned)
    assert may_run_on(replace(selector, tolerations=(Toleration("", "Exists", "", ""),)), cordoned)
    strange = waiting(affinity_terms=((NodeRequirement("gpu", "Near", ("a100",)),),))
    assert choose_for_pressure(nodes, held, [strange], offers).chosen == ()  # unreadable: never a guess


def test_a_pod_no_owner_set_can_fit_reclaims_nothing() -> None:
    nodes = [gpu_node("n1", 2), gpu_node("n2", 2)]
    held = [pod("a", node="n1", gpu_request=2), pod("b", node="n2", gpu_request=2)]
    offers = {owner("a"): {"n1": 2}, owner("b"): {"n2": 2}}
    assert choose_for_pressure(nodes, held, [waiting(gpus=4)], offers).chosen == ()  # no 4-GPU node
    small = [gpu_node("n1", 4)]
    held = [pod("a", node="n1", gpu_request=2), busy("n1", 2)]
    assert choose_for_pressure(small, held, [waiting(gpus=4)], {owner("a"): {"n1": 2}}).chosen == ()


def _fits(
    pending: PendingPod,
    nodes: list[NodeView],
    held: list[PodView],
    offers: Mapping[OwnerKey, Mapping[str, int]],
    keys: set[OwnerKey],
) -> bool:
    free = free_gpus(nodes, held, frozenset())
    return any(
        may_run_on(pending, n)
        and free[n.name] + sum(offers[k].get(n.name, 0) for k in keys) >= pending.gpu_request
        for n in nodes
    )


@st.composite
def clusters(
    draw: st.DrawFn,
) -> tuple[list[NodeView], list[PodView], dict[OwnerKey, dict[str, int]], PendingPod]:
    count = draw(st.integers(1, 4))
    nodes = [
        gpu_node(f"n{i}", draw(st.integers(1, 8)), {"zone": draw(st.sampled_from("ab"))})
        for i in range(count)
    ]
    held: list[PodView] = []
    offers: dict[OwnerKey, dict[str, int]] = {}
    for i, n in enumerate(nodes):
        left = n.gpu_capacity
        j = 0
        while left > 0:
            gpus = draw(st.integers(1, left))
            left -= gpus
            name = f"p{i}-{j}"
            j += 1
            if draw(st.booleans()):  # a due idle owner (some own pods on two nodes)
                key = owner(draw(st.sampled_from([name, "shared"])))
                offers.setdefault(key, {})
                offers[key][n.name] = offers[key].get(n.name, 0) + gpus
                held.append(pod(name, node=n.name, gpu_request=gpus))
            elif draw(st.booleans()):
                held.append(busy(n.name, gpus, name))
    zone = draw(st.sampled_from(["", "a", "b"]))
    pending = waiting(gpus=draw(st.integers(1, 8)), node_selector={"zone": zone} if zone else {})
    return nodes, held, offers, pending


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_the_chosen_owners_are_needed_and_enough(
    case: tuple[list[NodeView], list[PodView], dict[OwnerKey, dict[str, int]], PendingPod],
) -> None:
    nodes, held, offers, pending = case
    choice = choose_for_pressure(nodes, held, [pending], offers)
    chosen = set(choice.chosen)
    assert len(chosen) == len(choice.chosen)
    assert chosen <= set(offers)
    if _fits(pending, nodes, held, offers, set()):
        assert not chosen  # fits already: nothing reclaimed
    elif _fits(pending, nodes, held, offers, set(offers)):
        assert _fits(pending, nodes, held, offers, chosen)  # enough
        for key in chosen:  # and no chosen owner can be dropped
            assert not _fits(pending, nodes, held, offers, chosen - {key})
    else:
        assert not chosen  # no set makes it fit: nothing reclaimed for nothing
    assert choose_for_pressure(nodes, held, [], offers).chosen == ()


def test_control_the_generator_reaches_a_pod_that_only_reclaims_make_fit() -> None:
    """The property above also holds if nothing is ever chosen: its generator must reach a waiting
    pod that does not fit now, fits with reclaims, and gets owners chosen for it."""

    def needs_reclaims(
        case: tuple[list[NodeView], list[PodView], dict[OwnerKey, dict[str, int]], PendingPod],
    ) -> bool:
        nodes, held, offers, pending = case
        return not _fits(pending, nodes, held, offers, set()) and bool(
            choose_for_pressure(nodes, held, [pending], offers).chosen
        )

    reached(clusters(), needs_reclaims)
