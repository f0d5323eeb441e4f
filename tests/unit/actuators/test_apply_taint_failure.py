"""A node whose taint write failed keeps its old fault record, so the taint is retried.

The engine records a granted taint as set in the record written with it (so an admin's removal
before the next cycle is respected). If the taint itself failed, writing that record would make the
next cycle take the missing taint for an admin's removal and never retry: the applier skips it.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from tests.unit.actuators.test_nodes import FakeCore, make_node

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.api.names import FAULT_RECOVERED, NODE_FAULTS
from gpu_efficiency.engine.model import AnnotateNode, SetNodeCondition, TaintNode
from gpu_efficiency.engine.outcomes import Result


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str]] = []

    def record(self, ref: Any, reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((ref.name, reason))


def _applier(core: FakeCore) -> Applier:
    applier = Applier(api_client=client.ApiClient(), recorder=_Events())  # type: ignore[arg-type]
    applier.core = core  # type: ignore[assignment]
    return applier


RECORD = '{"faults":{"ecc":{"tainted":true}}}'


def test_a_failed_taint_skips_that_nodes_record_but_not_other_writes() -> None:
    core = FakeCore(make_node("n1"), make_node("n2"))
    core.fail_next = 500  # the taint of n1 fails
    actions = [
        TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
        SetNodeCondition(node="n1", status="False", reason="GPUFaultECC", message="ecc fault on GPU 0"),
        AnnotateNode(node="n1", annotations={NODE_FAULTS: RECORD}),
        TaintNode(node="n2", kind="ecc", effect="NoSchedule"),
        AnnotateNode(node="n2", annotations={NODE_FAULTS: RECORD}),
    ]
    outcomes = _applier(core).apply(actions, policy_name="p", policy_uid="u")
    results = [o.result for o in outcomes]
    assert results == [Result.FAILED, Result.DONE, Result.SKIPPED, Result.DONE, Result.DONE]
    assert "retried" in outcomes[2].message
    assert NODE_FAULTS not in (core.nodes["n1"].metadata.annotations or {})
    assert core.nodes["n2"].metadata.annotations[NODE_FAULTS] == RECORD


def test_annotations_without_the_record_are_still_written_after_a_failed_taint() -> None:
    core = FakeCore(make_node("n1", annotations={FAULT_RECOVERED: "xid"}))
    core.fail_next = 500
    outcomes = _applier(core).apply(
        [
            TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
            AnnotateNode(node="n1", annotations={FAULT_RECOVERED: None}),
        ],
        policy_name="p",
        policy_uid="u",
    )
    assert [o.result for o in outcomes] == [Result.FAILED, Result.DONE]
