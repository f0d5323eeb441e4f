"""Circuit breaker: the budget, who gets tainted first, the events when it flips, and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as s
from tests.unit.engine.quarantine.support import (
    DBE_ERROR,
    HOT,
    HOT_RECOVERY,
    NAN,
    XID_79,
    Cluster,
    counter,
    gpu,
    node,
    of_type,
    policy,
    st,
    writes,
)
from tests.unit.engine.quarantine.test_dra import XID_48, DraCluster, dra_gpus, dra_node, eight
from tests.unit.positive_control import reached

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import CircuitBreaker
from gpu_efficiency.engine.model import GPUSample, NodeEvent, PolicyEvent, Signal, TaintNode
from gpu_efficiency.engine.quarantine.breaker import GpuCost, decide_taints, gpu_budget, taint_budget


@pytest.mark.parametrize(
    ("nodes", "fraction", "cap", "expected"),
    [
        (10, 0.2, None, 2),
        (9, 0.2, None, 1),
        (3, 0.2, None, 1),  # a small cluster still quarantines one bad node
        (100, 0.29, None, 29),  # no float rounding down to 28
        (10, 0.0, None, 0),
        (10, 0.5, 3, 3),
        (10, 0.2, 0, 0),
        (0, 0.2, None, 0),
        (10, 1.0, None, 10),
    ],
)
def test_taint_budget(nodes: int, fraction: float, cap: int | None, expected: int) -> None:
    breaker = CircuitBreaker(max_tainted_fraction=fraction, max_tainted_nodes=cap)
    assert taint_budget(nodes, breaker) == expected


def test_worst_faults_first_then_by_name() -> None:
    wishes = {"a": ["thermal"], "b": ["xid"], "c": ["ecc"], "d": ["ecc", "thermal"], "e": ["xid"]}
    decision = decide_taints(wishes, tainted_now=set(), budget=3)
    assert decision.granted == {"c", "d", "b"}
    assert decision.denied == ("e", "a")


def test_already_tainted_nodes_use_the_budget_and_may_take_more_kinds() -> None:
    decision = decide_taints({"a": ["xid"], "b": ["ecc"]}, tainted_now={"a", "z"}, budget=2)
    assert decision.granted == {"a"}
    assert decision.denied == ("b",)


NODE_WISHES = s.dictionaries(
    s.sampled_from([f"n{i}" for i in range(12)]),
    s.lists(s.sampled_from(["ecc", "xid", "thermal"]), min_size=1, max_size=3),
)
NODES_TAINTED = s.sets(s.sampled_from([f"n{i}" for i in range(12)]))
NODE_BUDGETS = s.integers(0, 12)


@settings(max_examples=100, deadline=None)
@given(wishes=NODE_WISHES, tainted=NODES_TAINTED, budget=NODE_BUDGETS)
def test_never_more_tainted_nodes_than_the_budget_allows(
    wishes: dict[str, list[str]], tainted: set[str], budget: int
) -> None:
    decision = decide_taints(wishes, tainted, budget)
    after = tainted | decision.granted
    assert len(after) <= max(budget, len(tainted))
    assert set(decision.denied) | decision.granted == set(wishes)
    assert not set(decision.denied) & decision.granted


def test_control_the_node_budget_grants_and_denies_on_the_property_s_draws() -> None:
    """The property above also holds for a breaker that grants nothing: its own generator must
    reach a case where the budget grants some new taints and denies others."""

    def binds(case: tuple[dict[str, list[str]], set[str], int]) -> bool:
        decision = decide_taints(*case)
        return bool(decision.granted - case[1]) and bool(decision.denied)

    wishes, tainted, budget = reached(s.tuples(NODE_WISHES, NODES_TAINTED, NODE_BUDGETS), binds)
    assert len(tainted | decide_taints(wishes, tainted, budget).granted) == max(budget, len(tainted))


def _ten_nodes_five_faulty() -> tuple[Cluster, list[GPUSample]]:
    cluster = Cluster.of(*(node(f"n{i:02d}") for i in range(10)))
    faults: dict[str, dict[str, Any]] = {
        "n01": {"hold": HOT, "recovery": HOT_RECOVERY},
        "n02": {"fault": XID_79},
        "n05": {"hold": HOT, "recovery": HOT_RECOVERY},
        "n07": {"fault": DBE_ERROR},
        "n09": {"fault": XID_79},
    }
    return cluster, [gpu(f"n{i:02d}", **faults.get(f"n{i:02d}", {})) for i in range(10)]


def test_ten_nodes_five_faulty_at_most_two_tainted_worst_first() -> None:
    cluster, gpus = _ten_nodes_five_faulty()
    outcome = cluster.cycle(gpus)
    assert sorted(a.node for a in of_type(outcome.actions, TaintNode)) == ["n02", "n07"]
    assert outcome.breaker_open
    assert "at most 2 of 10" in outcome.breaker_message
    breaker_events = [a for a in outcome.actions if getattr(a, "reason", "") == names.EV_BREAKER]
    assert sorted(a.node for a in breaker_events if isinstance(a, NodeEvent)) == ["n01", "n05", "n09"]
    assert len([a for a in breaker_events if isinstance(a, PolicyEvent)]) == 1
    assert sum(q.tainted for q in outcome.quarantined) == 2
    assert len(outcome.quarantined) == 5

    again = cluster.cycle(gpus)  # still open: no repeated breaker events, no new taint
    assert [a for a in again.actions if getattr(a, "reason", "") == names.EV_BREAKER] == []
    assert of_type(again.actions, TaintNode) == []
    assert again.breaker_open
    assert cluster.cycle(gpus).actions == ()
    assert cluster.tainted_nodes() == {"n02", "n07"}


def test_the_breaker_closes_when_room_frees_up() -> None:
    cluster, gpus = _ten_nodes_five_faulty()
    cluster.cycle(gpus)
    cluster.cycle(gpus)
    cluster.annotate("n07", names.FAULT_RECOVERED, "all")
    cluster.cycle(gpus)  # the untaint happens; the slot frees only once it is confirmed
    outcome = cluster.cycle(gpus)
    assert [a.node for a in of_type(outcome.actions, TaintNode)] == ["n09"]
    assert outcome.breaker_open  # n01 and n05 still wait


def test_garbage_on_half_the_cluster_taints_nothing() -> None:
    cluster = Cluster.of(*(node(f"n{i}") for i in range(10)))
    garbage = [
        {Signal.ECC_DBE_VOLATILE: counter(0, 1, resets=1)},
        {Signal.ECC_DBE_VOLATILE: counter(-5, 1)},
        {Signal.ECC_DBE_VOLATILE: st(NAN)},
        {Signal.XID: st(NAN, changes=1)},
        {Signal.XID: st(-79, changes=1)},
    ]
    gpus = [gpu(f"n{i}", fault=garbage[i] if i < 5 else None) for i in range(10)]
    for _ in range(3):
        outcome = cluster.cycle(gpus)
        assert outcome.actions == ()
        assert not outcome.breaker_open

    # the control: the same counters, sound, on the same nodes of the same cluster do taint
    sound = [
        {Signal.ECC_DBE_VOLATILE: counter(0, 1)},
        {Signal.ECC_DBE_VOLATILE: counter(0, 1)},
        {Signal.ECC_DBE_VOLATILE: counter(0, 1)},
        {Signal.XID: st(79, low=0, high=79, changes=1)},
        {Signal.XID: st(79, low=0, high=79, changes=1)},
    ]
    outcome = cluster.cycle([gpu(f"n{i}", fault=sound[i] if i < 5 else None) for i in range(10)])
    assert sorted(a.node for a in of_type(outcome.actions, TaintNode)) == ["n0", "n1"]
    assert outcome.breaker_open


def test_observe_mode_never_opens_the_breaker() -> None:
    cluster, gpus = _ten_nodes_five_faulty()
    cluster.spec = policy("Observe")
    outcome = cluster.cycle(gpus)
    assert not outcome.breaker_open
    assert of_type(outcome.actions, TaintNode) == []
    assert len(outcome.quarantined) == 5


def test_without_data_the_breaker_keeps_its_state() -> None:
    cluster, gpus = _ten_nodes_five_faulty()
    cluster.cycle(gpus)
    cluster.cycle(gpus)  # taints confirmed in the records
    down = cluster.cycle([], metrics_available=False)
    assert down.breaker_open
    assert "at most 2 of 10" in down.breaker_message
    assert writes(down.actions) == []


# -- the GPU cap -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacities", "fraction", "gpu_fraction", "expected"),
    [
        ([8] * 10, 0.2, None, 16),  # defaults to maxTaintedFraction
        ([8] * 10, 0.5, 0.1, 8),
        ([8, 1, 1], 0.2, None, 8),  # never less than the largest node: one node may always be tainted
        ([8] * 10, 0.2, 0.0, 0),
        ([], 0.2, None, 0),
        ([8] * 100, 1.0, 0.29, 232),  # no float rounding down
    ],
)
def test_gpu_budget(
    capacities: list[int], fraction: float, gpu_fraction: float | None, expected: int
) -> None:
    breaker = CircuitBreaker(max_tainted_fraction=fraction, max_quarantined_gpu_fraction=gpu_fraction)
    assert gpu_budget(capacities, breaker) == expected


def test_a_node_whose_quarantine_grows_needs_gpu_room_one_that_does_not_passes() -> None:
    costs = {"a": GpuCost(now=1, after=2), "b": GpuCost(now=1, after=1), "c": GpuCost(now=0, after=1)}
    decision = decide_taints(
        {"a": ["xid"], "b": ["xid"], "c": ["xid"]}, tainted_now={"a", "b"}, budget=10, gpus=costs, gpu_cap=2
    )
    assert decision.granted == {"b"}  # a stronger effect on b takes no more GPUs
    assert decision.denied == ("a", "c")
    assert decision.gpus_now == 2
    roomier = decide_taints(
        {"a": ["xid"], "c": ["ecc"]}, tainted_now={"a", "b"}, budget=10, gpus=costs, gpu_cap=3
    )
    assert roomier.granted == {"c"}  # worst fault first: ecc before xid
    assert roomier.denied == ("a",)


GPUS_HELD = s.dictionaries(s.sampled_from([f"n{i}" for i in range(8)]), s.integers(1, 8))
GPU_WISHES = s.dictionaries(
    s.sampled_from([f"n{i}" for i in range(8)]),
    s.tuples(s.sampled_from(["ecc", "xid", "thermal"]), s.integers(0, 8)),
)


def _gpu_costs(held: dict[str, int], wishes: dict[str, tuple[str, int]]) -> dict[str, GpuCost]:
    costs = {
        n: GpuCost(now=held.get(n, 0), after=max(held.get(n, 0), extra)) for n, (_, extra) in wishes.items()
    }
    costs.update({n: GpuCost(now=c, after=c) for n, c in held.items() if n not in costs})
    return costs


@settings(max_examples=200, deadline=None)
@given(held=GPUS_HELD, wishes=GPU_WISHES, budget=s.integers(0, 8), gpu_cap=s.integers(0, 64))
def test_never_more_quarantined_gpus_than_the_gpu_budget_allows(
    held: dict[str, int], wishes: dict[str, tuple[str, int]], budget: int, gpu_cap: int
) -> None:
    costs = _gpu_costs(held, wishes)
    decision = decide_taints(
        {n: [k] for n, (k, _) in wishes.items()}, set(held), budget, gpus=costs, gpu_cap=gpu_cap
    )
    after = sum(costs[n].after if n in decision.granted else costs[n].now for n in costs)
    assert after <= max(gpu_cap, sum(held.values()))
    assert len(set(held) | decision.granted) <= max(budget, len(held))
    assert set(decision.denied) | decision.granted == set(wishes)


def test_control_the_gpu_cap_grants_and_denies_on_the_property_s_draws() -> None:
    """The GPU property above also holds for a cap that grants nothing: its generator must reach a
    case where the node budget has room, the GPU cap grants a new quarantine and denies another."""
    draws = s.tuples(GPUS_HELD, GPU_WISHES, s.integers(0, 64))

    def cap_binds(case: tuple[dict[str, int], dict[str, tuple[str, int]], int]) -> bool:
        held, wishes, gpu_cap = case
        decision = decide_taints(
            {n: [k] for n, (k, _) in wishes.items()},
            set(held),
            8,
            gpus=_gpu_costs(held, wishes),
            gpu_cap=gpu_cap,
        )
        return bool(decision.granted - set(held)) and bool(decision.denied)

    reached(draws, cap_binds, tries=2000)


def test_device_taints_count_against_the_gpu_cap_and_hold_further_quarantines() -> None:
    spec = policy(circuit_breaker={"max_tainted_fraction": 1.0, "max_quarantined_gpu_fraction": 0.1})
    cluster = DraCluster.of(*(dra_node(f"n{i}") for i in range(10)), spec=spec)
    cluster.devices = [d for i in range(10) for d in dra_gpus(f"n{i}")]  # 80 GPUs: 8 may be quarantined
    gpus = [g for i in range(10) for g in eight(f"n{i}", g0=XID_48 if i < 9 else None)]
    outcome = cluster.cycle(gpus)
    assert len(cluster.tainted_devices()) == 8  # n0..n7 get their device rule, n8 waits
    assert outcome.breaker_open
    assert "at most 8 of 80 GPUs may be quarantined" in outcome.breaker_message
    denied = [a for a in outcome.actions if isinstance(a, NodeEvent) and a.reason == names.EV_BREAKER]
    assert [a.node for a in denied] == ["n8"]


def test_a_node_taint_takes_all_of_its_gpus_from_the_gpu_cap() -> None:
    spec = policy(circuit_breaker={"max_tainted_fraction": 1.0, "max_quarantined_gpu_fraction": 0.1})
    cluster = DraCluster.of(*(dra_node(f"n{i}") for i in range(10)), spec=spec)
    cluster.devices = [d for i in range(10) for d in dra_gpus(f"n{i}")]
    healthy = [g for i in range(2, 10) for g in eight(f"n{i}")]
    cluster.cycle([*eight("n0", g2=XID_79), *eight("n1"), *healthy])  # reboot class: the whole node
    assert cluster.tainted_nodes() == {"n0"}
    outcome = cluster.cycle([*eight("n0"), *eight("n1", g5=XID_48), *healthy])
    assert cluster.tainted_devices() == []  # 8 GPUs already out: no room for n1's device
    assert outcome.breaker_open
