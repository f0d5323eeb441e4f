"""PCIe link rule (``engine/quarantine/pcie.py``) and the ``pcie`` degraded fault it feeds.

A link narrower than its maximum counts at any load; a lower generation only while the GPU is busy
(GPUs lower the link speed at idle to save power). Judged on the fault window's extremes; garbage
is never a fault. The node of a down-trained link gets GPUDegraded=True (never a taint unless the
policy asks, in Enforce mode) and is released once the link is back at full width.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.quarantine.support import (
    NAN,
    NOW,
    Cluster,
    gpu,
    node,
    of_type,
    policy,
    st,
)
from tests.unit.engine.stragglers.test_outliers import events, slowed, snap, straggler_annotations

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import NodeEvent, Signal, Stats, Window
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.quarantine.data import data_rules
from gpu_efficiency.engine.quarantine.kinds import GpuState
from gpu_efficiency.engine.quarantine.pcie import judge_pcie

RULES = data_rules(cycle_params(policy()), NOW)
FAULT, HEALTHY, PENDING, UNKNOWN = GpuState.FAULT, GpuState.HEALTHY, GpuState.PENDING, GpuState.UNKNOWN
WIDTH, MAX_WIDTH = Signal.PCIE_LINK_WIDTH, Signal.PCIE_MAX_LINK_WIDTH
GEN, MAX_GEN, UTIL = Signal.PCIE_LINK_GEN, Signal.PCIE_MAX_LINK_GEN, Signal.GPU_UTIL


def link(
    width: float = 16,
    gen: float = 1,
    *,
    max_width: float = 16,
    max_gen: float = 5,
    util: float = 0,
    width_low: float | None = None,
    gen_low: float | None = None,
    **kw: Any,
) -> dict[Signal, Stats | None]:
    """An H100's link over the fault window; idle (Gen1, utilization 0) unless told."""
    return {
        WIDTH: st(width, low=width_low, **kw),
        MAX_WIDTH: st(max_width, **kw),
        GEN: st(gen, low=gen_low, **kw),
        MAX_GEN: st(max_gen, **kw),
        UTIL: st(util, **kw),
    }  # fmt: skip


BUSY = 95.0


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param(link(), HEALTHY, id="idle-full-width-gen1-is-power-saving"),
        pytest.param(link(gen=5, util=BUSY), HEALTHY, id="busy-full-link"),
        pytest.param(link(width=8), FAULT, id="idle-x8-of-x16"),
        pytest.param(link(width=8, gen=5, util=BUSY), FAULT, id="busy-x8-of-x16"),
        pytest.param(link(gen=3, util=BUSY), FAULT, id="busy-gen3-of-gen5"),
        pytest.param(link(gen=3, util=30), HEALTHY, id="lightly-used-gen3-not-judged"),
        pytest.param(link(gen=5, gen_low=1, util=BUSY), HEALTHY, id="busy-gen-reaching-max"),
        pytest.param(link(width=16, width_low=8), PENDING, id="width-came-and-went"),
        pytest.param(link(gen=3) | {UTIL: None}, PENDING, id="low-gen-load-unknown"),
        pytest.param(link(width=0), UNKNOWN, id="width-zero"),
        pytest.param(link(width=NAN), UNKNOWN, id="width-nan"),
        pytest.param(link(width=32), UNKNOWN, id="width-over-max"),
        pytest.param(link(width=3), UNKNOWN, id="width-not-pcie"),
        pytest.param(link(width=8.5), UNKNOWN, id="width-not-integer"),
        pytest.param(link(width=8, max_width=0), UNKNOWN, id="max-width-zero"),
        pytest.param(link(gen=0, util=BUSY), UNKNOWN, id="gen-zero"),
        pytest.param(link(gen=3, max_gen=math.inf, util=BUSY), UNKNOWN, id="max-gen-inf"),
        pytest.param(link(width=8) | {MAX_WIDTH: st(16, low=8)}, UNKNOWN, id="max-changed"),
        pytest.param(link(width=8) | {MAX_WIDTH: None}, UNKNOWN, id="max-missing"),
        pytest.param(link(width=8, age=600), UNKNOWN, id="stale"),
        pytest.param(link(width=8, count=2), UNKNOWN, id="too-sparse"),
        pytest.param({}, UNKNOWN, id="not-exported"),
    ],
)
def test_pcie_rule(fault: dict[Signal, Stats | None], expected: GpuState) -> None:
    judgement = judge_pcie(gpu("n1", fault=fault), RULES)
    assert judgement.state is expected, judgement


def test_the_summary_names_the_link() -> None:
    assert judge_pcie(gpu("n1", fault=link(width=8)), RULES).summary == "link x8 of x16"
    busy = judge_pcie(gpu("n1", fault=link(width=8, gen=3, util=BUSY)), RULES)
    assert busy.summary == "link Gen3 of Gen5, x8 of x16"


# ---- the degraded fault ---------------------------------------------------------------------------


ABSENT = ("", "", "")


def degraded(cluster: Cluster, name: str) -> tuple[str, str, str]:
    found = cluster.maybe_condition(name, names.GPU_DEGRADED)
    return ABSENT if found is None else (found.status, found.reason, found.message)


def test_a_down_trained_link_on_an_idle_node_is_reported_never_tainted_and_recovers() -> None:
    cluster = Cluster.of(node("n1"), node("n2"), spec=policy("Enforce"))
    narrow = [gpu("n1", 0, fault=link(width=8)), gpu("n1", 1, fault=link()), gpu("n2", 0, fault=link())]
    first = cluster.cycle(narrow)
    state = degraded(cluster, "n1")
    assert state[:2] == ("True", "GPUDegradedPCIe")
    assert "pcie fault on GPU 0:GPU-n1-0 (link x8 of x16)" in state[2]
    messages = [e.message for e in of_type(first.actions, NodeEvent) if e.reason == names.EV_FAULT]
    assert messages == ["pcie fault on GPU 0:GPU-n1-0 (link x8 of x16)"]
    assert cluster.tainted_nodes() == set()
    assert degraded(cluster, "n2") == ABSENT
    assert cluster.maybe_condition("n2") is None
    assert cluster.maybe_condition("n1") is None  # GPUHealthy: a degraded link is not a broken GPU
    assert [q.kind for q in first.quarantined] == ["pcie"]
    steady = cluster.cycle(narrow)
    assert [a for a in steady.actions if not isinstance(a, NodeEvent)] == []  # nothing rewritten
    cluster.cycle([gpu("n1", 0, fault=link(width=16, width_low=8)), *narrow[1:]])
    assert degraded(cluster, "n1") == state  # back at times only: kept
    cluster.cycle([gpu("n1", 0, fault=link()), *narrow[1:]])
    state = degraded(cluster, "n1")
    assert state[:2] == ("False", "GPUDegradedCleared")
    assert names.NODE_FAULTS not in cluster.nodes["n1"].annotations


def test_the_policy_may_taint_a_down_trained_link_in_enforce_mode_only() -> None:
    narrow = [gpu("n1", 0, fault=link(width=8))]
    cluster = Cluster.of(node("n1"), node("n2"), node("n3"), node("n4"), node("n5"),
                         spec=policy("Enforce", pcie={"taint": True}))  # fmt: skip
    cluster.cycle(narrow)
    assert cluster.our_taint_values("n1") == ["pcie:PreferNoSchedule"]
    observe = Cluster.of(node("n1"), spec=policy("Observe", pcie={"taint": True}))
    observe.cycle(narrow)
    assert observe.tainted_nodes() == set()
    off = Cluster.of(node("n1"), spec=policy("Enforce", pcie={"enabled": False}))
    off.cycle(narrow)
    assert degraded(off, "n1") == ABSENT


def test_two_degraded_kinds_have_a_degraded_reason_that_clears() -> None:
    """With a straggler and a PCIe link held, GPUDegraded keeps the reason prefix it clears by."""
    record = (
        '{"faults": {"straggler": {"since": "2023-11-14T22:00:00Z", "detected": "2023-11-14T22:00:00Z", '
        '"gpus": [{"index": "1", "uuid": "GPU-n1-1", "value": "40% slower"}]}}}'
    )
    cluster = Cluster.of(node("n1", annotations={names.NODE_FAULTS: record}), spec=policy("Observe"))
    cluster.cycle([gpu("n1", 0, fault=link(width=8))])
    state = degraded(cluster, "n1")
    assert state[:2] == ("True", "GPUDegradedMultiple")
    cluster.annotate("n1", names.FAULT_RECOVERED, "straggler")
    cluster.cycle([gpu("n1", 0, fault=link())])
    state = degraded(cluster, "n1")
    assert state[:2] == ("False", "GPUDegradedCleared")


# ---- a straggler's cause --------------------------------------------------------------------------


no_faults = b.no_faults


@pytest.mark.usefixtures("no_faults")
def test_a_straggler_behind_a_down_trained_link_names_it_as_its_cause() -> None:
    snapshot = snap(slowed(sm=0.55, tensor=0.3, power=420.0))
    slow = next(g for g in snapshot.gpus if g.uuid == "GPU-train-3-0")
    window = {k: v for k, v in link(width=8, gen=5, util=BUSY).items() if v is not None}
    with_link = replace(slow, stats={**slow.stats, Window.FAULT: window})
    snapshot = replace(snapshot, gpus=tuple(with_link if g is slow else g for g in snapshot.gpus))
    plan = plan_cycle(snapshot)
    for _ in range(2):
        snapshot = b.apply_plan(snapshot, plan)
        plan = plan_cycle(snapshot)
    text = straggler_annotations(plan)["train-0"] or ""
    assert text.endswith("cause: PCIe link x8 of x16 (down-trained)")
    assert [e.node for e in events(plan) if isinstance(e, NodeEvent)] == ["node-3"]
