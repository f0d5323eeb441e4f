"""Whole-cluster properties of fault quarantine over several cycles, on random clusters.

- garbage, sparse, missing or ignored data never taints a node nor marks it unhealthy;
- the number of tainted nodes never exceeds the breaker's budget;
- others' taints survive; Observe never taints;
- the steady state is silent: with unchanged data the third cycle makes no action at all.
"""

from __future__ import annotations

import math
from typing import Any

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
)
from tests.unit.positive_control import reached

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import GPUSample, Signal, Taint, TaintNode

FAULTY: dict[str, dict[str, Any]] = {
    "dbe": {"fault": DBE_ERROR},
    "xid79": {"fault": XID_79},
    "hot": {"hold": HOT, "recovery": HOT_RECOVERY},
}
HARMLESS: dict[str, dict[str, Any]] = {
    "healthy": {},
    "xid13": {"fault": {Signal.XID: st(13, low=0, high=13, changes=1)}},
    "dbe-reset": {"fault": {Signal.ECC_DBE_VOLATILE: counter(0, 4, resets=1)}},
    "dbe-negative": {"fault": {Signal.ECC_DBE_VOLATILE: counter(-2, 4)}},
    "dbe-nan": {"fault": {Signal.ECC_DBE_VOLATILE: st(NAN)}},
    "xid-nan": {"fault": {Signal.XID: st(NAN, changes=1)}},
    "sparse": {
        "fault": {Signal.ECC_DBE_VOLATILE: counter(0, 3, count=1)},
        "hold": {Signal.GPU_TEMP: st(99, count=1)},
    },
    "stale": {"fault": {Signal.XID: st(79, changes=1, age=900)}, "hold": {Signal.GPU_TEMP: st(99, age=900)}},
    "missing": {"fault": dict.fromkeys(Signal), "hold": dict.fromkeys(Signal)},
    "briefly-hot": {"hold": {Signal.GPU_TEMP: st(99, low=60, high=99)}},
}
FOREIGN = Taint("example.com/maintenance", "true", "NoSchedule")

clusters = s.lists(
    s.tuples(
        s.lists(s.sampled_from(sorted(FAULTY) + sorted(HARMLESS)), min_size=1, max_size=3),
        s.booleans(),  # carries someone else's taint
    ),
    min_size=1,
    max_size=10,
)


def _build(spec: list[tuple[list[str], bool]]) -> tuple[list[Any], list[GPUSample]]:
    views, gpus = [], []
    for n, (profiles, foreign) in enumerate(spec):
        name = f"n{n:02d}"
        views.append(node(name, taints=(FOREIGN,) if foreign else ()))
        for index, profile in enumerate(profiles):
            gpus.append(gpu(name, index, **(FAULTY | HARMLESS)[profile]))
    return views, gpus


@settings(max_examples=40, deadline=None)
@given(spec=clusters, enforce=s.booleans(), fraction=s.sampled_from([0.0, 0.2, 0.5, 1.0]))
def test_cluster_invariants(spec: list[tuple[list[str], bool]], enforce: bool, fraction: float) -> None:
    views, gpus = _build(spec)
    breaker = {"maxTaintedFraction": fraction}
    cluster = Cluster.of(*views, spec=policy("Enforce" if enforce else "Observe", circuitBreaker=breaker))
    budget = math.floor(fraction * len(views) + 1e-9)
    budget = max(budget, 1) if fraction > 0 else 0  # the documented rule, restated independently
    harmless = {f"n{n:02d}" for n, (profiles, _) in enumerate(spec) if not set(profiles) & set(FAULTY)}
    outcomes = [cluster.cycle(gpus, advance=10.0) for _ in range(4)]

    assert len(cluster.tainted_nodes()) <= budget
    if not enforce:
        assert cluster.tainted_nodes() == set()
        assert all(of_type(o.actions, TaintNode) == [] for o in outcomes)
    for name in harmless:
        assert name not in cluster.tainted_nodes()
        assert cluster.maybe_condition(name) is None
        assert names.NODE_FAULTS not in cluster.nodes[name].annotations
    for view in views:
        assert set(view.taints) <= set(cluster.nodes[view.name].taints)
    assert outcomes[2].actions == ()
    assert outcomes[3].actions == ()
    assert outcomes[3].breaker_open == (enforce and len(views) - len(harmless) > budget)


def test_control_the_generator_reaches_taints_and_an_open_breaker() -> None:
    """The invariants above also hold for an engine that never taints: the same generator must
    reach an Enforce cluster where faulty nodes are tainted up to the budget and the breaker opens."""

    def taints_to_the_budget(spec: list[tuple[list[str], bool]]) -> bool:
        views, gpus = _build(spec)
        cluster = Cluster.of(*views, spec=policy("Enforce", circuitBreaker={"maxTaintedFraction": 0.2}))
        outcomes = [cluster.cycle(gpus, advance=10.0) for _ in range(2)]
        return len(cluster.tainted_nodes()) >= 1 and outcomes[-1].breaker_open

    spec = reached(clusters, taints_to_the_budget, tries=300)
    assert sum(bool(set(profiles) & set(FAULTY)) for profiles, _ in spec) > max(1, len(spec) // 5)
