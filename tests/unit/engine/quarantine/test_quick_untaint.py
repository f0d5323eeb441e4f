"""An admin who removes our taint before the next cycle is respected, like one who waits.

The e2e test (tests/e2e/test_faults_e2e.py) found that an admin acting on the NodeTainted event
within one interval got the node tainted again: the record only learnt of our taint by seeing it
one cycle later, so a taint removed before that looked like one never set, and was set again.
"""

from __future__ import annotations

from tests.unit.engine.quarantine.support import (
    Cluster,
    counter,
    gpu,
    node,
    of_type,
    policy,
    reasons,
    record_of,
)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import Signal, TaintNode


def test_a_taint_removed_before_the_next_cycle_is_respected_until_a_new_fault() -> None:
    cluster = Cluster.of(node("n1"))
    data = [gpu("n1", fault={Signal.ECC_DBE_VOLATILE: counter(0, 2)})]
    first = cluster.cycle(data)
    assert of_type(first.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]
    assert record_of(cluster.nodes["n1"])["faults"]["ecc"]["tainted"] is True, "the record knows the taint"
    cluster.remove_taints("n1")  # the admin, right after the NodeTainted event
    noticed = cluster.cycle(data)
    assert of_type(noticed.actions, TaintNode) == []
    assert names.EV_UNTAINTED in reasons(noticed.actions)
    assert record_of(cluster.nodes["n1"])["faults"]["ecc"]["manualUntaint"] is True
    for _ in range(3):
        assert of_type(cluster.cycle(data).actions, TaintNode) == []
    assert cluster.tainted_nodes() == set()
    again = cluster.cycle([gpu("n1", fault={Signal.ECC_DBE_VOLATILE: counter(2, 3)})])
    assert of_type(again.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]


def test_a_taint_the_breaker_denies_is_not_recorded_as_set() -> None:
    spec = policy(circuit_breaker={"max_tainted_nodes": 1, "max_tainted_fraction": 1.0})
    cluster = Cluster.of(node("n1"), node("n2"), spec=spec)
    faulty = {Signal.ECC_DBE_VOLATILE: counter(0, 1)}
    first = cluster.cycle([gpu("n1", fault=faulty), gpu("n2", fault=faulty)])
    assert of_type(first.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]
    assert record_of(cluster.nodes["n2"])["faults"]["ecc"]["tainted"] is False
    # the breaker closes (n1 recovered by hand): n2, never tainted, is tainted now, not "respected"
    cluster.annotate("n1", names.FAULT_RECOVERED, "ecc")
    cluster.cycle([gpu("n1", fault=faulty), gpu("n2", fault=faulty)])  # n1's taint removed
    later = cluster.cycle([gpu("n1", fault=faulty), gpu("n2", fault=faulty)])
    assert of_type(later.actions, TaintNode) == [TaintNode(node="n2", kind="ecc", effect="NoSchedule")]
    assert cluster.our_taint_values("n2") == ["ecc:NoSchedule"]
