"""Pods on a GPU held faulty get an annotation and an event; both go when the fault is recovered."""

from __future__ import annotations

import json
from dataclasses import replace

from tests.unit.engine.quarantine.support import NOW, gpu, node, of_type, snapshot, st

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotateNode, AnnotatePod, NodeView, PodEvent, PodRef, PodView, Signal
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults

XID_79 = {Signal.XID: st(79, low=0, high=79, changes=1)}


def pod(name: str, node_name: str = "n1", annotations: dict[str, str] | None = None) -> PodView:
    return PodView(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        node=node_name,
        phase="Running",
        labels={},
        annotations=annotations or {},
        controller_kind=None,
        priority=0,
        start_time=NOW - 3600,
        gpu_request=1,
    )


def on(sample: object, *pods: str) -> object:
    return replace(sample, pods=tuple(PodRef("team", p) for p in pods))  # type: ignore[type-var]


def run(nodes: list[NodeView], gpus: list[object], pods: list[PodView]):  # type: ignore[no-untyped-def]
    snap = replace(snapshot(nodes, gpus), pods=tuple(pods))  # type: ignore[arg-type]
    return evaluate_faults(snap)


def test_the_pod_on_the_faulty_gpu_gets_an_annotation_and_an_event_others_do_not() -> None:
    outcome = run(
        [node("n1")],
        [on(gpu("n1", 3, fault=XID_79), "victim"), on(gpu("n1", 4), "bystander")],
        [pod("victim"), pod("bystander")],
    )
    (annotate,) = of_type(outcome.actions, AnnotatePod)
    assert annotate.name == "victim"
    note = json.loads(annotate.annotations[names.POD_GPU_FAULT])
    assert note["kind"] == "xid"
    assert note["code"] == 79
    assert "fallen off the bus" in note["meaning"]
    assert note["node"] == "n1"
    assert note["gpu"] == "3:GPU-n1-3"
    (event,) = of_type(outcome.actions, PodEvent)
    assert (event.name, event.reason, event.type) == ("victim", names.EV_POD_GPU_FAULT, "Warning")
    assert "XID 79" in event.message


def test_an_unchanged_annotation_is_not_written_again() -> None:
    first = run([node("n1")], [on(gpu("n1", 3, fault=XID_79), "victim")], [pod("victim")])
    (annotate,) = of_type(first.actions, AnnotatePod)
    # the next cycle sees the record and the pod's annotation
    (record,) = [a for a in of_type(first.actions, AnnotateNode) if names.NODE_FAULTS in a.annotations]
    held = replace(node("n1"), annotations={names.NODE_FAULTS: record.annotations[names.NODE_FAULTS]})
    again = run(
        [held],
        [on(gpu("n1", 3, fault=XID_79), "victim")],
        [pod("victim", annotations=dict(annotate.annotations))],
    )
    assert of_type(again.actions, AnnotatePod) == []
    assert of_type(again.actions, PodEvent) == []


def test_the_annotation_is_removed_when_the_fault_is_recovered() -> None:
    annotated = pod("victim", annotations={names.POD_GPU_FAULT: '{"kind":"xid"}'})
    outcome = run([node("n1")], [on(gpu("n1", 3), "victim")], [annotated])
    (annotate,) = of_type(outcome.actions, AnnotatePod)
    assert annotate.annotations == {names.POD_GPU_FAULT: None}
    (event,) = of_type(outcome.actions, PodEvent)
    assert event.type == "Normal"


def test_pods_on_out_of_scope_nodes_are_left_alone() -> None:
    annotated = pod("elsewhere", node_name="cpu-node", annotations={names.POD_GPU_FAULT: "{}"})
    outcome = run([node("n1")], [gpu("n1")], [annotated])
    assert of_type(outcome.actions, AnnotatePod) == []
