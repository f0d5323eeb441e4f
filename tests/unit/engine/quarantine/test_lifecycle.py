"""Fault quarantine over several cycles: detection, taints, recovery, manual untaint, modes, scope.

Each test runs ``evaluate_faults`` against a small ``Cluster`` that applies the actions between
cycles, so what is checked is what the API server would hold, and that a steady state is silent.
"""

from __future__ import annotations

from tests.unit.engine.quarantine.support import (
    DBE_ERROR,
    HOT,
    HOT_RECOVERY,
    XID_79,
    Cluster,
    counter,
    gpu,
    node,
    of_type,
    policy,
    reasons,
    record_of,
    snapshot,
    st,
    writes,
)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    AnnotateNode,
    NodeCondition,
    NodeEvent,
    SetNodeCondition,
    Signal,
    Taint,
    TaintNode,
    UntaintNode,
)
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults

ECC_GPU = gpu("n1", 3, fault=DBE_ERROR)


def test_ecc_fault_taints_names_the_gpu_then_goes_quiet() -> None:
    cluster = Cluster.of(node("n1"), node("n2"))
    first = cluster.cycle([ECC_GPU, gpu("n2")])
    assert of_type(first.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]
    (condition,) = of_type(first.actions, SetNodeCondition)
    assert (condition.status, condition.reason) == ("False", "GPUFaultECC")
    assert "GPU 3:GPU-n1-3" in condition.message
    assert "dbe=1 (+1)" in condition.message
    assert reasons(first.actions).count(names.EV_FAULT) == 2  # node and policy
    assert names.EV_TAINTED in reasons(first.actions)
    assert [(q.node, q.kind, q.gpus, q.tainted) for q in first.quarantined] == [
        ("n1", "ecc", ("3:GPU-n1-3",), True)
    ]
    assert cluster.our_taint_values("n1") == ["ecc:NoSchedule"]
    assert cluster.our_taint_values("n2") == []

    second = cluster.cycle([ECC_GPU, gpu("n2")])  # the taint is seen: the record confirms it
    assert [type(a) for a in second.actions] == [AnnotateNode]
    assert record_of(cluster.nodes["n1"])["faults"]["ecc"]["tainted"] is True

    third = cluster.cycle([ECC_GPU, gpu("n2")])  # the increase is still in the lookback window
    assert third.actions == ()
    later = cluster.cycle([gpu("n1", 3, fault={Signal.ECC_DBE_VOLATILE: counter(1, 1)}), gpu("n2")])
    assert later.actions == ()
    assert cluster.condition("n1") is not None
    assert cluster.condition("n1").status == "False"


def test_observe_mode_writes_condition_record_and_events_but_never_taints() -> None:
    cluster = Cluster.of(node("n1"), spec=policy("Observe"))
    outcome = cluster.cycle([gpu("n1", fault=XID_79)])
    assert of_type(outcome.actions, TaintNode) == []
    assert of_type(outcome.actions, SetNodeCondition)[0].reason == "GPUFaultXID"
    assert names.EV_FAULT in reasons(outcome.actions)
    assert names.EV_TAINTED not in reasons(outcome.actions)
    assert record_of(cluster.nodes["n1"])["faults"]["xid"]["tainted"] is False
    assert outcome.quarantined[0].tainted is False
    assert cluster.cycle([gpu("n1", fault=XID_79)]).actions == ()


def test_manual_recovery_untaints_clears_and_the_same_xid_never_retriggers() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", fault=XID_79)])
    cluster.annotate("n1", names.FAULT_RECOVERED, "xid")
    recovery = cluster.cycle([gpu("n1", fault=XID_79)])  # 60s later: the change is still in the lookback
    assert of_type(recovery.actions, UntaintNode) == [UntaintNode(node="n1", kind="xid")]
    assert names.EV_UNTAINTED in reasons(recovery.actions)
    assert names.FAULT_RECOVERED not in cluster.nodes["n1"].annotations
    assert cluster.our_taint_values("n1") == []
    assert cluster.condition("n1").status == "True"
    assert recovery.quarantined == ()

    confirm = cluster.cycle([gpu("n1", fault=XID_79)])  # 120s: still (just) in the window
    assert of_type(confirm.actions, TaintNode) == []
    assert "faults" not in record_of(cluster.nodes["n1"])
    steady = [gpu("n1", fault={Signal.XID: st(79)})]  # then 79 stays in the gauge, no change
    for _ in range(5):
        assert of_type(cluster.cycle(steady).actions, TaintNode) == []
    assert cluster.tainted_nodes() == set()
    assert record_of(cluster.nodes["n1"]) == {}  # the baseline aged out
    assert cluster.cycle(steady).actions == ()

    new = cluster.cycle([gpu("n1", fault={Signal.XID: st(48, low=48, high=79, changes=1)})])
    assert of_type(new.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]


def test_manual_recovery_keeps_the_same_ecc_values_from_retriggering_but_not_a_new_error() -> None:
    failure = {Signal.ROW_REMAP_FAILURE: st(1)}
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", fault=failure)])
    cluster.annotate("n1", names.FAULT_RECOVERED, "all")
    cluster.cycle([gpu("n1", fault=failure)])
    for _ in range(3):
        assert of_type(cluster.cycle([gpu("n1", fault=failure)]).actions, TaintNode) == []
    assert cluster.tainted_nodes() == set()
    worse = cluster.cycle([gpu("n1", fault={**failure, **DBE_ERROR})])
    assert of_type(worse.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]


def test_an_admins_manual_untaint_is_respected_until_a_new_fault() -> None:
    cluster = Cluster.of(node("n1"))
    data = [gpu("n1", fault={Signal.ECC_DBE_VOLATILE: counter(0, 2)})]
    cluster.cycle(data)
    cluster.cycle(data)  # taint confirmed in the record
    cluster.remove_taints("n1")
    noticed = cluster.cycle(data)
    assert of_type(noticed.actions, TaintNode) == []
    assert names.EV_UNTAINTED in reasons(noticed.actions)
    assert record_of(cluster.nodes["n1"])["faults"]["ecc"]["manualUntaint"] is True
    assert cluster.condition("n1").status == "False"  # still faulty, just not tainted
    assert noticed.quarantined[0].tainted is False
    for _ in range(3):
        assert cluster.cycle(data).actions == ()
    again = cluster.cycle([gpu("n1", fault={Signal.ECC_DBE_VOLATILE: counter(2, 3)})])
    assert of_type(again.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoSchedule")]
    assert names.EV_FAULT in reasons(again.actions)


def test_thermal_needs_the_full_hold_and_recovers_automatically() -> None:
    cluster = Cluster.of(node("n1"))
    short = cluster.cycle([gpu("n1", hold={Signal.GPU_TEMP: st(95, low=70, high=97)})])
    assert short.actions == ()
    hot = cluster.cycle([gpu("n1", hold=HOT, recovery=HOT_RECOVERY)])
    assert of_type(hot.actions, TaintNode) == [TaintNode(node="n1", kind="thermal", effect="NoSchedule")]
    assert "temperature above 90C for 2m" in of_type(hot.actions, SetNodeCondition)[0].message
    cooling = cluster.cycle([gpu("n1", recovery=HOT_RECOVERY)])  # cool now, not for recoveryAfter yet
    assert of_type(cooling.actions, UntaintNode) == []
    cool = cluster.cycle([gpu("n1")])
    assert of_type(cool.actions, UntaintNode) == [UntaintNode(node="n1", kind="thermal")]
    assert names.EV_UNTAINTED in reasons(cool.actions)
    assert cluster.condition("n1").status == "True"
    cluster.cycle([gpu("n1")])
    assert cluster.cycle([gpu("n1")]).actions == ()
    assert "faults" not in record_of(cluster.nodes["n1"])


def test_unknown_data_neither_recovers_nor_raises() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", hold=HOT, recovery=HOT_RECOVERY)])
    cluster.cycle([gpu("n1", hold=HOT, recovery=HOT_RECOVERY)])
    sparse = {Signal.GPU_TEMP: st(60, count=2)}
    for _ in range(3):
        outcome = cluster.cycle([gpu("n1", hold=sparse, recovery=sparse)])
        assert writes(outcome.actions) == []
    assert cluster.our_taint_values("n1") == ["thermal:NoSchedule"]
    assert cluster.cycle([]).actions == ()  # no samples at all: the fault stays as it is


def test_metrics_down_blocks_detection_and_new_taints_but_not_manual_recovery() -> None:
    cluster = Cluster.of(node("n1"), node("n2"))
    down = cluster.cycle([gpu("n1", fault=DBE_ERROR)], metrics_available=False)
    assert down.actions == ()
    assert any("metrics unavailable" in n for n in down.notes)
    cluster.spec = policy("Observe")
    cluster.cycle([gpu("n1", fault=DBE_ERROR)])
    cluster.spec = policy("Enforce")
    blocked = cluster.cycle([], metrics_available=False)
    assert of_type(blocked.actions, TaintNode) == []  # held, but no new taint without data
    cluster.annotate("n1", names.FAULT_RECOVERED, "ecc")
    recovered = cluster.cycle([], metrics_available=False)
    assert of_type(recovered.actions, SetNodeCondition)[0].status == "True"


def test_taints_and_conditions_set_by_others_are_untouched() -> None:
    foreign = (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint(names.FAULT_TAINT_KEY, "manual-hold", "NoSchedule"),
    )
    theirs = NodeCondition(
        names.GPU_HEALTHY, "False", "DriverMismatch", "set by someone", "2023-01-01T00:00:00Z"
    )
    cluster = Cluster.of(node("n1", taints=foreign, conditions=(theirs,)))
    assert cluster.cycle([gpu("n1")]).actions == ()  # not ours to flip back to True
    cluster.cycle([gpu("n1", fault=XID_79)])
    assert cluster.our_taint_values("n1") == ["xid.manual-hold:NoSchedule"]
    cluster.annotate("n1", names.FAULT_RECOVERED, "all")
    cluster.cycle([gpu("n1")])
    assert cluster.our_taint_values("n1") == ["manual-hold:NoSchedule"]
    assert Taint("nvidia.com/gpu", "present", "NoSchedule") in cluster.nodes["n1"].taints


def test_two_kinds_with_one_effect_share_one_taint_and_a_combined_reason() -> None:
    cluster = Cluster.of(node("n1"))
    outcome = cluster.cycle([gpu("n1", fault={**DBE_ERROR, **XID_79})])
    assert of_type(outcome.actions, TaintNode) == [
        TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
        TaintNode(node="n1", kind="xid", effect="NoSchedule"),
    ]
    assert cluster.our_taint_values("n1") == ["ecc.xid:NoSchedule"]
    assert cluster.condition("n1").reason == "GPUFaultMultiple"
    cluster.annotate("n1", names.FAULT_RECOVERED, "ecc")
    cluster.cycle([gpu("n1", fault=XID_79)])
    assert cluster.our_taint_values("n1") == ["xid:NoSchedule"]
    assert cluster.condition("n1").reason == "GPUFaultXID"


def test_condition_transition_time_stays_while_the_fault_changes() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", fault=DBE_ERROR)])
    since = cluster.condition("n1").last_transition_time
    cluster.cycle([gpu("n1", fault={**DBE_ERROR, **XID_79})])
    assert cluster.condition("n1").reason == "GPUFaultMultiple"
    assert cluster.condition("n1").last_transition_time == since


def test_a_changed_taint_effect_moves_the_taint() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", fault=DBE_ERROR)])
    cluster.spec = policy("Enforce", ecc={"effect": "NoExecute"})
    outcome = cluster.cycle([gpu("n1", fault=DBE_ERROR)])
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="ecc", effect="NoExecute")]
    assert cluster.our_taint_values("n1") == ["ecc:NoExecute"]


def test_disabled_kinds_and_nodes_out_of_scope_are_left_alone() -> None:
    spec = policy("Enforce", xid={"enabled": False})
    selected = {"selection": {"nodeSelector": {"matchLabels": {"pool": "a"}}}}
    assert evaluate_faults(snapshot([node("n1")], [gpu("n1", fault=XID_79)], spec=spec)).actions == ()
    scoped = policy("Enforce").model_copy(update={"selection": policy().model_validate(selected).selection})
    nodes = [node("n1", labels={"pool": "b"}), node("n2", gpus=0)]
    gpus = [gpu("n1", fault=DBE_ERROR), gpu("n2", fault=DBE_ERROR)]
    assert evaluate_faults(snapshot(nodes, gpus, spec=scoped)).actions == ()
    assert (
        evaluate_faults(
            snapshot([node("n1")], [gpu("n1", fault=DBE_ERROR)], spec=policy(enabled=False))
        ).actions
        == ()
    )


def test_a_gpu_seen_by_prometheus_and_the_agent_faults_when_either_sees_it() -> None:
    sources = [gpu("n1", source="prometheus"), gpu("n1", fault=XID_79, source="agent")]
    outcome = evaluate_faults(snapshot([node("n1")], sources))
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]


def test_an_unreadable_record_is_reported_and_replaced() -> None:
    view = node("n1", annotations={names.NODE_FAULTS: "{not json"})
    outcome = evaluate_faults(snapshot([view], [gpu("n1")]))
    assert any("unreadable fault record" in n for n in outcome.notes)
    assert of_type(outcome.actions, AnnotateNode) == [
        AnnotateNode(node="n1", annotations={names.NODE_FAULTS: None})
    ]


def test_unknown_recovery_tokens_are_noted_and_the_request_removed() -> None:
    view = node("n1", annotations={names.FAULT_RECOVERED: "bogus"})
    outcome = evaluate_faults(snapshot([view], [gpu("n1")]))
    assert of_type(outcome.actions, AnnotateNode) == [
        AnnotateNode(node="n1", annotations={names.FAULT_RECOVERED: None})
    ]
    assert any("bogus" in n for n in outcome.notes)
    assert of_type(outcome.actions, NodeEvent) == []


def test_a_source_without_data_does_not_veto_a_recovery() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", hold=HOT, recovery=HOT_RECOVERY)])
    cluster.cycle([gpu("n1", hold=HOT, recovery=HOT_RECOVERY)])
    no_thermal = dict.fromkeys((Signal.GPU_TEMP, Signal.MEMORY_TEMP, Signal.CLOCK_EVENTS))
    agent = gpu("n1", hold=no_thermal, recovery=no_thermal, source="agent")
    outcome = cluster.cycle([gpu("n1"), agent])
    assert of_type(outcome.actions, UntaintNode) == [UntaintNode(node="n1", kind="thermal")]
