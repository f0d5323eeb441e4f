"""Node actuator against a small in-memory CoreV1Api that enforces what the API server enforces here.

The fake keeps real ``kubernetes.client`` models, bumps ``resourceVersion`` on every write, answers
409 to a patch carrying a stale one, rejects taints that are not unique by (key, effect) with 422
(as node validation does), replaces ``spec.taints`` wholesale (an atomic list) and merges
``status.conditions`` by type (strategic merge). Hooks simulate a concurrent writer and failures.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as s
from kubernetes.client import V1Node, V1NodeCondition, V1NodeSpec, V1NodeStatus, V1ObjectMeta, V1Taint
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.nodes import (
    annotate_node,
    apply_taint,
    remove_taint,
    set_gpu_healthy_condition,
)
from gpu_efficiency.api.names import FAULT_TAINT_KEY, GPU_DEGRADED, GPU_HEALTHY, NODE_FAULTS
from gpu_efficiency.engine.model import AnnotateNode, SetNodeCondition, TaintNode, UntaintNode
from gpu_efficiency.engine.outcomes import Result

KEY = FAULT_TAINT_KEY
T0 = 1_700_000_000.0
EARLY = datetime(2023, 1, 1, tzinfo=UTC)


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


class FakeCore:
    """read_node / patch_node / patch_node_status with resourceVersion conflicts."""

    def __init__(self, *nodes: Any) -> None:
        self.nodes: dict[str, Any] = {n.metadata.name: n for n in nodes}
        self.writes: list[tuple[str, str, Any]] = []
        self.reads = 0
        self.before_write: Callable[[FakeCore, str], None] | None = None
        self.fail_next: int | None = None

    def read_node(self, name: str) -> Any:
        self.reads += 1
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.nodes[name])

    def patch_node(self, name: str, body: Any) -> Any:
        return self._patch("patch_node", name, body)

    def patch_node_status(self, name: str, body: Any) -> Any:
        return self._patch("patch_node_status", name, body)

    def bump(self, name: str, mutate: Callable[[Any], None] = lambda n: None) -> None:
        """Another writer changes the node."""
        node = self.nodes[name]
        mutate(node)
        node.metadata.resource_version = str(int(node.metadata.resource_version) + 1)

    def _patch(self, verb: str, name: str, body: Any) -> Any:
        if self.before_write is not None:
            self.before_write(self, name)
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            raise ApiException(status=status, reason="Injected")
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        node: Any = copy.deepcopy(self.nodes[name])
        meta = body.get("metadata", {})
        wanted = meta.get("resourceVersion")
        if wanted is not None and wanted != node.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        if "annotations" in meta:
            annotations = dict(node.metadata.annotations or {})
            for key, value in meta["annotations"].items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            node.metadata.annotations = annotations
        if "spec" in body and verb == "patch_node":
            node.spec.taints = [
                V1Taint(
                    key=t["key"],
                    value=t.get("value"),
                    effect=t["effect"],
                    time_added=_time(t.get("timeAdded")),
                )
                for t in body["spec"].get("taints") or []
            ]
            pairs = [(t.key, t.effect) for t in node.spec.taints]
            if len(pairs) != len(set(pairs)):
                raise ApiException(status=422, reason="Invalid: taints must be unique by key and effect pair")
        if "status" in body and verb == "patch_node_status":
            conditions = {c.type: c for c in node.status.conditions or []}
            for c in body["status"]["conditions"]:
                conditions[c["type"]] = V1NodeCondition(
                    type=c["type"],
                    status=c["status"],
                    reason=c.get("reason"),
                    message=c.get("message"),
                    last_transition_time=_time(c.get("lastTransitionTime")),
                    last_heartbeat_time=_time(c.get("lastHeartbeatTime")),
                )
            node.status.conditions = list(conditions.values())
        node.metadata.resource_version = str(int(node.metadata.resource_version) + 1)
        self.nodes[name] = node
        self.writes.append((verb, name, body))
        return copy.deepcopy(node)

    # -- views for assertions ---------------------------------------------------------------------

    def taints(self, name: str = "n1") -> list[tuple[str, str | None, str]]:
        return sorted((t.key, t.value, t.effect) for t in self.nodes[name].spec.taints or [])

    def condition(self, name: str = "n1") -> Any:
        return next((c for c in self.nodes[name].status.conditions or [] if c.type == GPU_HEALTHY), None)


def make_node(
    name: str = "n1",
    taints: list[V1Taint] | None = None,
    conditions: list[V1NodeCondition] | None = None,
    annotations: dict[str, str] | None = None,
) -> V1Node:
    return V1Node(
        metadata=V1ObjectMeta(name=name, resource_version="1", annotations=annotations),
        spec=V1NodeSpec(taints=taints),
        status=V1NodeStatus(conditions=conditions or []),
    )


def foreign() -> V1Taint:
    return V1Taint(key="example.com/maintenance", value="true", effect="NoExecute", time_added=EARLY)


# ---- taints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "action", "after", "result"),
    [
        pytest.param(
            [],
            TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
            [(KEY, "ecc", "NoSchedule")],
            Result.DONE,
            id="add",
        ),
        pytest.param(
            [(KEY, "ecc", "NoSchedule")],
            TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
            [(KEY, "ecc", "NoSchedule")],
            Result.NOOP,
            id="already-there",
        ),
        pytest.param(
            [(KEY, "xid", "NoSchedule")],
            TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
            [(KEY, "ecc.xid", "NoSchedule")],
            Result.DONE,
            id="same-effect-shares-the-taint",
        ),
        pytest.param(
            [(KEY, "xid", "NoSchedule")],
            TaintNode(node="n1", kind="thermal", effect="PreferNoSchedule"),
            [(KEY, "thermal", "PreferNoSchedule"), (KEY, "xid", "NoSchedule")],
            Result.DONE,
            id="other-effect-own-taint",
        ),
        pytest.param(
            [(KEY, "ecc.xid", "NoSchedule")],
            TaintNode(node="n1", kind="ecc", effect="NoExecute"),
            [(KEY, "ecc", "NoExecute"), (KEY, "xid", "NoSchedule")],
            Result.DONE,
            id="effect-change-moves-the-kind",
        ),
        pytest.param(
            [(KEY, "ecc.xid", "NoSchedule")],
            UntaintNode(node="n1", kind="ecc"),
            [(KEY, "xid", "NoSchedule")],
            Result.DONE,
            id="remove-one-kind",
        ),
        pytest.param(
            [(KEY, "ecc", "NoSchedule")],
            UntaintNode(node="n1", kind="ecc"),
            [],
            Result.DONE,
            id="remove-last",
        ),
        pytest.param(
            [(KEY, "xid", "NoSchedule")],
            UntaintNode(node="n1", kind="ecc"),
            [(KEY, "xid", "NoSchedule")],
            Result.NOOP,
            id="absent",
        ),
        pytest.param(
            [(KEY, "manual", "NoSchedule")],
            UntaintNode(node="n1", kind="manual-hold"),
            [(KEY, "manual", "NoSchedule")],
            Result.NOOP,
            id="another-value-of-our-key-untouched",
        ),
        pytest.param(
            [("other/key", "ecc", "NoSchedule")],
            UntaintNode(node="n1", kind="ecc"),
            [("other/key", "ecc", "NoSchedule")],
            Result.NOOP,
            id="other-key-untouched",
        ),
    ],
)
def test_taint_edits(
    before: list[tuple[str, str, str]],
    action: TaintNode | UntaintNode,
    after: list[tuple[str, str, str]],
    result: Result,
) -> None:
    core = FakeCore(make_node(taints=[V1Taint(key=k, value=v, effect=e) for k, v, e in before] + [foreign()]))
    outcome = apply_taint(core, action) if isinstance(action, TaintNode) else remove_taint(core, action)
    assert outcome.result is result, outcome
    assert core.taints() == sorted([*after, ("example.com/maintenance", "true", "NoExecute")])
    assert len(core.writes) == (1 if result is Result.DONE else 0)
    kept = next(t for t in core.nodes["n1"].spec.taints if t.key == "example.com/maintenance")
    assert kept.time_added == EARLY


def test_taint_patch_carries_the_resource_version() -> None:
    core = FakeCore(make_node())
    apply_taint(core, TaintNode(node="n1", kind="ecc", effect="NoSchedule"))
    (_, _, body) = core.writes[0]
    assert body["metadata"]["resourceVersion"] == "1"


def test_a_conflict_rereads_and_keeps_the_other_writers_change() -> None:
    core = FakeCore(make_node())
    calls = {"n": 0}

    def concurrent(fake: FakeCore, name: str) -> None:
        calls["n"] += 1
        if calls["n"] == 1:  # someone taints the node between our read and our write
            fake.bump(name, lambda n: setattr(n.spec, "taints", [foreign()]))

    core.before_write = concurrent
    outcome = apply_taint(core, TaintNode(node="n1", kind="xid", effect="NoSchedule"))
    assert outcome.result is Result.DONE
    assert core.taints() == [("example.com/maintenance", "true", "NoExecute"), (KEY, "xid", "NoSchedule")]
    assert core.reads == 2


def test_endless_conflicts_fail_after_bounded_attempts() -> None:
    core = FakeCore(make_node())
    core.before_write = lambda fake, name: fake.bump(name)
    outcome = remove_taint(core, UntaintNode(node="n1", kind="ecc"), max_attempts=3)
    assert outcome.result is Result.NOOP  # nothing to remove: no write attempted at all
    outcome = apply_taint(core, TaintNode(node="n1", kind="ecc", effect="NoSchedule"), max_attempts=3)
    assert outcome.result is Result.FAILED
    assert "conflict" in outcome.message
    assert core.reads == 4
    assert core.taints() == []


def test_missing_node_and_errors() -> None:
    core = FakeCore(make_node())
    assert apply_taint(core, TaintNode(node="gone", kind="ecc", effect="NoSchedule")).result is Result.SKIPPED
    assert core.writes == []
    core.fail_next = 500
    failed = apply_taint(core, TaintNode(node="n1", kind="ecc", effect="NoSchedule"))
    assert failed.result is Result.FAILED
    assert "500" in failed.message


# ---- GPUHealthy condition ---------------------------------------------------------------------------


def _condition(status: str, reason: str, message: str = "m") -> V1NodeCondition:
    return V1NodeCondition(
        type=GPU_HEALTHY,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=EARLY,
        last_heartbeat_time=EARLY,
    )


def test_condition_is_created_with_transition_and_heartbeat_now() -> None:
    ready = V1NodeCondition(type="Ready", status="True", last_transition_time=EARLY)
    core = FakeCore(make_node(conditions=[ready]))
    outcome = set_gpu_healthy_condition(
        core, SetNodeCondition(node="n1", status="False", reason="GPUFaultECC", message="dbe"), T0
    )
    assert outcome.result is Result.DONE
    cond = core.condition()
    assert (cond.status, cond.reason, cond.message) == ("False", "GPUFaultECC", "dbe")
    assert cond.last_transition_time == datetime.fromtimestamp(T0, UTC)
    assert cond.last_heartbeat_time == datetime.fromtimestamp(T0, UTC)
    assert [c.type for c in core.nodes["n1"].status.conditions] == ["Ready", GPU_HEALTHY]
    assert core.writes[0][0] == "patch_node_status"


def test_same_status_new_reason_keeps_the_transition_time() -> None:
    core = FakeCore(make_node(conditions=[_condition("False", "GPUFaultECC")]))
    set_gpu_healthy_condition(
        core, SetNodeCondition(node="n1", status="False", reason="GPUFaultMultiple", message="ecc; xid"), T0
    )
    cond = core.condition()
    assert cond.reason == "GPUFaultMultiple"
    assert cond.last_transition_time == EARLY
    assert cond.last_heartbeat_time == datetime.fromtimestamp(T0, UTC)


def test_status_flip_moves_the_transition_time() -> None:
    core = FakeCore(make_node(conditions=[_condition("False", "GPUFaultECC")]))
    set_gpu_healthy_condition(
        core, SetNodeCondition(node="n1", status="True", reason="GPUFaultCleared", message="ok"), T0
    )
    assert core.condition().last_transition_time == datetime.fromtimestamp(T0, UTC)


def test_unchanged_condition_is_not_written_not_even_a_heartbeat() -> None:
    core = FakeCore(make_node(conditions=[_condition("False", "GPUFaultECC", "dbe")]))
    outcome = set_gpu_healthy_condition(
        core, SetNodeCondition(node="n1", status="False", reason="GPUFaultECC", message="dbe"), T0
    )
    assert outcome.result is Result.NOOP
    assert core.writes == []
    assert core.condition().last_heartbeat_time == EARLY


def test_the_degraded_condition_is_its_own_type_beside_gpu_healthy() -> None:
    core = FakeCore(make_node(conditions=[_condition("False", "GPUFaultECC", "dbe")]))
    action = SetNodeCondition(
        node="n1", status="True", reason="GPUDegradedStraggler", message="slow", type=GPU_DEGRADED
    )
    assert set_gpu_healthy_condition(core, action, T0).result is Result.DONE
    by_type = {c.type: (c.status, c.reason) for c in core.nodes["n1"].status.conditions}
    assert by_type == {GPU_HEALTHY: ("False", "GPUFaultECC"), GPU_DEGRADED: ("True", "GPUDegradedStraggler")}
    assert set_gpu_healthy_condition(core, action, T0).result is Result.NOOP


# ---- annotations ------------------------------------------------------------------------------------


def test_annotations_merge_remove_and_skip_no_ops() -> None:
    core = FakeCore(
        make_node(annotations={"keep": "me", NODE_FAULTS: "{}", "gpuefficiency.io/fault-recovered": "all"})
    )
    outcome = annotate_node(
        core,
        AnnotateNode(
            node="n1", annotations={NODE_FAULTS: '{"faults":{}}', "gpuefficiency.io/fault-recovered": None}
        ),
    )
    assert outcome.result is Result.DONE
    assert core.nodes["n1"].metadata.annotations == {"keep": "me", NODE_FAULTS: '{"faults":{}}'}
    assert core.writes[0][2] == {
        "metadata": {"annotations": {NODE_FAULTS: '{"faults":{}}', "gpuefficiency.io/fault-recovered": None}}
    }
    again = annotate_node(
        core, AnnotateNode(node="n1", annotations={NODE_FAULTS: '{"faults":{}}', "absent": None})
    )
    assert again.result is Result.NOOP
    assert len(core.writes) == 1
    assert annotate_node(core, AnnotateNode(node="gone", annotations={"a": "b"})).result is Result.SKIPPED


# ---- property: any sequence of edits keeps the taints valid and ours only ---------------------------

edits = s.lists(
    s.tuples(
        s.sampled_from(["taint", "untaint"]),
        s.sampled_from(["ecc", "xid", "thermal"]),
        s.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops=edits)
def test_taint_edits_match_a_simple_model(ops: list[tuple[str, str, str]]) -> None:
    core = FakeCore(
        make_node(taints=[foreign(), V1Taint(key=KEY, value="manual", effect="PreferNoSchedule")])
    )
    model: dict[str, str] = {}
    for op, kind, effect in ops:
        if op == "taint":
            outcome = apply_taint(core, TaintNode(node="n1", kind=kind, effect=effect))
            model[kind] = effect
        else:
            outcome = remove_taint(core, UntaintNode(node="n1", kind=kind))
            model.pop(kind, None)
        assert outcome.result in (Result.DONE, Result.NOOP), outcome
    held: dict[str, str] = {}
    tokens: list[str] = []
    for key, value, effect in core.taints():
        if key == KEY:
            for token in (value or "").split("."):
                tokens.append(token)
                if token != "manual":
                    held[token] = effect
    assert held == model
    assert tokens.count("manual") == 1  # another's value on our key is never dropped
    assert ("example.com/maintenance", "true", "NoExecute") in core.taints()
