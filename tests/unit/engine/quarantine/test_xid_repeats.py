"""XID sightings over cycles: repeat rules, one event for a flood, multi-node application incidents."""

from __future__ import annotations

import json

from tests.unit.engine.quarantine.support import Cluster, gpu, node, of_type, policy, st

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import NodeEvent, PolicyEvent, SetNodeCondition, Signal, TaintNode
from gpu_efficiency.engine.quarantine.xid_repeats import parse_history


def changed(code: int, before: int = 13) -> dict[Signal, object]:
    """The XID gauge went from ``before`` to ``code`` within the lookback."""
    return {Signal.XID: st(code, low=min(code, before), high=max(code, before), changes=1)}


def steady(code: int) -> dict[Signal, object]:
    return {Signal.XID: st(code)}


def fault_events(outcome: object) -> list[NodeEvent]:
    return [e for e in of_type(outcome.actions, NodeEvent) if e.reason == names.EV_FAULT]  # type: ignore[attr-defined]


def test_a_repeat_code_taints_only_once_it_was_seen_count_times_within_the_window() -> None:
    spec = policy(xid={"repeat": [{"codes": [95], "count": 3, "within": "1h"}]})
    cluster = Cluster.of(node("n1"), spec=spec)
    for attempt in range(2):  # two separate sightings (13 in between), 5 minutes apart
        outcome = cluster.cycle([gpu("n1", fault=changed(95))], advance=150)
        assert of_type(outcome.actions, TaintNode) == [], attempt
        cluster.cycle([gpu("n1", fault=changed(13, before=95))], advance=150)
    third = cluster.cycle([gpu("n1", fault=changed(95))])
    assert of_type(third.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]
    (event,) = fault_events(third)
    assert "xid=95 x3 in 1h" in event.message  # the event carries the count


def test_repeat_sightings_older_than_within_do_not_count() -> None:
    spec = policy(xid={"repeat": [{"codes": [95], "count": 2, "within": "10m"}]})
    cluster = Cluster.of(node("n1"), spec=spec)
    cluster.cycle([gpu("n1", fault=changed(95))], advance=150)
    cluster.cycle([gpu("n1", fault=changed(13, before=95))], advance=600)  # the first one ages out
    late = cluster.cycle([gpu("n1", fault=changed(95))])
    assert of_type(late.actions, TaintNode) == []
    soon = Cluster.of(node("n1"), spec=spec)
    soon.cycle([gpu("n1", fault=changed(95))], advance=150)
    soon.cycle([gpu("n1", fault=changed(13, before=95))], advance=150)
    assert of_type(soon.cycle([gpu("n1", fault=changed(95))]).actions, TaintNode) == [
        TaintNode(node="n1", kind="xid", effect="NoSchedule")
    ]


def test_a_flood_of_the_same_xid_yields_one_event_and_a_count() -> None:
    cluster = Cluster.of(node("n1"))
    events = []
    for _ in range(6):  # 79 again and again, each time after the last change left the lookback
        events += fault_events(cluster.cycle([gpu("n1", fault=changed(79))], advance=150))
        cluster.cycle([gpu("n1", fault=steady(79))], advance=150)
    assert len(events) == 1
    record = json.loads(cluster.nodes["n1"].annotations[names.NODE_FAULTS])
    assert record["faults"]["xid"]["gpus"][0]["value"] == "xid=79 x6 in 1h"
    assert "x6" in cluster.condition("n1").message
    history, problem = parse_history(cluster.nodes["n1"].annotations[names.XID_HISTORY])
    assert problem == ""
    assert len(history.gpus["GPU-n1-0"][79]) == 6


def test_an_application_xid_burst_on_many_nodes_is_one_incident_and_taints_nothing() -> None:
    nodes = [node(f"n{i}") for i in range(12)]
    spec = policy(xid={"critical": [45]})  # even where a policy makes 45 critical
    cluster = Cluster.of(*nodes, spec=spec)
    burst = [gpu(f"n{i}", fault=changed(45, before=0)) for i in range(10)] + [gpu("n10"), gpu("n11")]
    first = cluster.cycle(burst)
    assert of_type(first.actions, TaintNode) == []
    incidents = [e for e in of_type(first.actions, PolicyEvent) if e.reason == names.EV_XID_INCIDENT]
    assert len(incidents) == 1
    assert "10 nodes" in incidents[0].message
    assert "n0, n1, n2" in incidents[0].message
    assert "XID 45" in incidents[0].message
    assert fault_events(first) == []
    second = cluster.cycle(burst)  # the changes are still in the window: no new incident, no taint
    assert of_type(second.actions, TaintNode) == []
    assert [e for e in of_type(second.actions, PolicyEvent) if e.reason == names.EV_XID_INCIDENT] == []
    assert cluster.tainted_nodes() == set()


def test_a_critical_application_xid_on_one_node_still_taints() -> None:
    cluster = Cluster.of(node("n1"), node("n2"), node("n3"), spec=policy(xid={"critical": [45]}))
    outcome = cluster.cycle([gpu("n1", fault=changed(45, before=0)), gpu("n2"), gpu("n3")])
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]
    assert of_type(outcome.actions, SetNodeCondition)[0].reason == "GPUFaultXID"


def test_the_history_is_pruned_and_removed_when_nothing_is_left() -> None:
    cluster = Cluster.of(node("n1"))
    cluster.cycle([gpu("n1", fault=changed(13, before=0))], advance=150)
    assert names.XID_HISTORY in cluster.nodes["n1"].annotations
    cluster.cycle([gpu("n1", fault=steady(13))], advance=3600)
    cluster.cycle([gpu("n1", fault=steady(13))])
    assert names.XID_HISTORY not in cluster.nodes["n1"].annotations


def test_a_malformed_history_is_reported_and_replaced() -> None:
    cluster = Cluster.of(node("n1", annotations={names.XID_HISTORY: "{not json"}))
    outcome = cluster.cycle([gpu("n1", fault=changed(79))])
    assert any("malformed" in n for n in outcome.notes)
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]
