"""``gpu-efficiency cleanup``: removes exactly what the operator wrote (our taint, conditions, device
rules, ``gpuefficiency.io/`` annotations) and never anyone else's; owners still reclaimed keep their
record and are listed with their restore command; --dry-run writes nothing; a running operator or an
API error is a clear failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import cleanup as cl
from gpu_efficiency import cli
from gpu_efficiency.api import names

OTHER_TAINT = client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
OUR_TAINT = client.V1Taint(key=names.FAULT_TAINT_KEY, value="ecc.xid", effect="NoSchedule")


def _node(
    name: str, *, taints: list[client.V1Taint], annotations: dict[str, str], conditions: list[str]
) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations, resource_version="7"),
        spec=client.V1NodeSpec(taints=taints),
        status=client.V1NodeStatus(
            conditions=[client.V1NodeCondition(type=t, status="True") for t in conditions]
        ),
    )


def _pod(ns: str, name: str, annotations: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(namespace=ns, name=name, annotations=annotations))


class FakeCore:
    def __init__(self, nodes: list[client.V1Node], pods: list[client.V1Pod], conflicts: int = 0) -> None:
        self.nodes = {n.metadata.name: n for n in nodes}
        self.pods = pods
        self.writes: list[tuple[str, str, Any, str]] = []
        self.conflicts = conflicts
        self.fail_pods: int | None = None

    def list_node(self) -> client.V1NodeList:
        return client.V1NodeList(items=list(self.nodes.values()))

    def read_node(self, name: str) -> client.V1Node:
        return self.nodes[name]

    read_node_status = read_node

    def patch_node(self, name: str, body: Any, _content_type: str) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.writes.append(("node", name, body, _content_type))

    def patch_node_status(self, name: str, body: Any, _content_type: str) -> None:
        self.writes.append(("node-status", name, body, _content_type))

    def list_pod_for_all_namespaces(self) -> client.V1PodList:
        return client.V1PodList(items=self.pods)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, _content_type: str) -> None:
        if self.fail_pods is not None:
            raise ApiException(status=self.fail_pods, reason="Forbidden")
        self.writes.append(("pod", f"{namespace}/{name}", body, _content_type))


class FakeCustom:
    """Owners by plural, and device taint rules (None: the API is not served)."""

    def __init__(self, owners: dict[str, list[dict[str, Any]]], rules: list[dict[str, Any]] | None) -> None:
        self.owners = owners
        self.rules = rules
        self.writes: list[tuple[str, ...]] = []
        self.bodies: list[Any] = []

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, label_selector: str = ""
    ) -> Any:
        if plural == cl.RULE_PLURAL:
            if self.rules is None:
                raise ApiException(status=404, reason="Not Found")
            assert label_selector == "app.kubernetes.io/managed-by=gpu-efficiency-operator"
            return {"items": self.rules}
        if plural not in self.owners:
            raise ApiException(status=404, reason="Not Found")  # the kind is not installed
        return {"items": self.owners[plural]}

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> None:
        self.writes.append(("delete", plural, name))

    def patch_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str, body: Any, _content_type: str) -> None:  # fmt: skip
        self.writes.append(("patch", plural, f"{ns}/{name}"))
        self.bodies.append(body)


def _owner(ns: str, name: str, annotations: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "annotations": annotations}, "spec": spec}


RECLAIMED = {
    names.RECLAIMED: "ScaleToZero",
    names.PREVIOUS_REPLICAS: "2",
    names.RECLAIMED_AT: "2026-11-27T03:00:00Z",
    names.RECLAIMED_BY: "idle-notebooks",
    "team.example/owner": "alice",
}


def _world(conflicts: int = 0, rules: list[dict[str, Any]] | None = None) -> tuple[FakeCore, FakeCustom]:
    core = FakeCore(
        [
            _node(
                "gpu-1",
                taints=[OTHER_TAINT, OUR_TAINT],
                annotations={names.NODE_FAULTS: "{}", names.XID_HISTORY: "{}", "other.io/keep": "x"},
                conditions=["Ready", names.GPU_HEALTHY, "MemoryPressure", names.GPU_DEGRADED],
            ),
            _node("cpu-1", taints=[OTHER_TAINT], annotations={"other.io/keep": "x"}, conditions=["Ready"]),
        ],
        [
            _pod("team-a", "nb-0", {names.STATE: "Idle", names.KEEP_FOR: "4h", "other.io/a": "1"}),
            _pod("team-a", "web-0", {"other.io/a": "1"}),
        ],
        conflicts=conflicts,
    )
    custom = FakeCustom(
        {
            "deployments": [
                _owner("team-a", "llm", RECLAIMED, {"replicas": 0}),
                _owner("team-a", "scaled-back", RECLAIMED, {"replicas": 2}),  # someone scaled it up by hand
                _owner("team-a", "plain", {"other.io/a": "1"}, {"replicas": 1}),
            ],
            "jobs": [_owner("team-b", "train", {names.RECLAIMED: "Suspend"}, {"suspend": True})],
            "notebooks": [
                _owner("team-c", "alice", {names.RECLAIMED: "Stop", names.KUBEFLOW_STOPPED: "t"}, {}),
            ],
        },
        rules
        if rules is not None
        else [
            {"metadata": {"name": "gpuefficiency-xid-gpu-1-gpu-0-abc"}},
            {"metadata": {"name": "someone-elses-rule"}},  # labelled as ours, not named so: left alone
        ],
    )
    return core, custom


def test_cleanup_removes_only_ours_and_lists_owners_still_reclaimed() -> None:
    core, custom = _world()
    result = cl.cleanup(core, custom, dry_run=False)
    assert not result.failed
    node_writes = {
        (kind, name): (body, ctype) for kind, name, body, ctype in core.writes if kind.startswith("node")
    }
    assert set(node_writes) == {("node", "gpu-1"), ("node-status", "gpu-1")}  # cpu-1 carries nothing of ours
    body, ctype = node_writes["node", "gpu-1"]
    assert ctype == cl.STRATEGIC
    assert body == {
        "metadata": {
            "resourceVersion": "7",
            "annotations": {names.NODE_FAULTS: None, names.XID_HISTORY: None},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    }
    ops, ctype = node_writes["node-status", "gpu-1"]
    assert ctype == cl.JSON_PATCH
    assert ops == [  # from the end; each removal guarded by the type it must remove
        {"op": "test", "path": "/status/conditions/3/type", "value": names.GPU_DEGRADED},
        {"op": "remove", "path": "/status/conditions/3"},
        {"op": "test", "path": "/status/conditions/1/type", "value": names.GPU_HEALTHY},
        {"op": "remove", "path": "/status/conditions/1"},
    ]
    pod_writes = [(name, body) for kind, name, body, _ in core.writes if kind == "pod"]
    assert pod_writes == [
        ("team-a/nb-0", {"metadata": {"annotations": {names.KEEP_FOR: None, names.STATE: None}}})
    ]
    assert ("delete", "devicetaintrules", "gpuefficiency-xid-gpu-1-gpu-0-abc") in custom.writes
    assert not any("someone-elses-rule" in w for w in custom.writes)
    # the owner scaled back by hand loses our stale record; the reclaimed ones keep theirs
    assert [w for w in custom.writes if w[0] == "patch"] == [("patch", "deployments", "team-a/scaled-back")]
    (body,) = custom.bodies
    assert set(body["metadata"]["annotations"]) == {
        names.RECLAIMED,
        names.PREVIOUS_REPLICAS,
        names.RECLAIMED_AT,
        names.RECLAIMED_BY,
    }  # team.example/owner is not ours
    assert [o.restore for o in result.reclaimed_owners] == [
        "gpu-efficiency restore deployment/llm -n team-a",
        "gpu-efficiency restore job/train -n team-b",
        "gpu-efficiency restore notebook/alice -n team-c",
    ]
    assert result.reclaimed_owners[0].reclaimed_by == "idle-notebooks"


def test_dry_run_writes_nothing_and_says_what_it_would_do() -> None:
    core, custom = _world()
    result = cl.cleanup(core, custom, dry_run=True)
    assert core.writes == []
    assert custom.writes == []
    assert {c.result for c in result.changes} == {"would"}
    table = cl.render_table(result.as_dict())
    assert table.startswith("Would change (5):")
    assert "node/gpu-1: remove taints gpuefficiency.io/gpu-fault=ecc.xid:NoSchedule" in table
    assert "gpu-efficiency restore notebook/alice -n team-c" in table


def test_a_conflict_is_retried_on_a_fresh_read() -> None:
    core, custom = _world(conflicts=2)
    result = cl.cleanup(core, custom, dry_run=False)
    assert not result.failed
    assert [name for kind, name, *_ in core.writes if kind == "node"] == ["gpu-1"]


def test_an_api_refusal_is_reported_failed_and_the_rest_still_cleaned() -> None:
    core, custom = _world()
    core.fail_pods = 403
    result = cl.cleanup(core, custom, dry_run=False)
    assert result.failed
    (failed,) = [c for c in result.changes if c.result.startswith("failed")]
    assert (failed.object, failed.result) == ("pod/team-a/nb-0", "failed: HTTP 403 Forbidden")
    assert any(w[0] == "delete" for w in custom.writes)


def test_device_taint_rules_not_served_is_a_note_not_a_failure() -> None:
    core, custom = _world()
    custom.rules = None
    result = cl.cleanup(core, custom, dry_run=False)
    assert not result.failed
    assert any("DeviceTaintRules" in n and "not served" in n for n in result.notes)


AT = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


class FakeLeases:
    def __init__(self, renewed_ago: float | None, now: datetime = AT) -> None:
        self.renewed_ago = renewed_ago
        self.now = now

    def list_lease_for_all_namespaces(self, field_selector: str) -> client.V1LeaseList:
        assert field_selector == "metadata.name=gpu-efficiency-operator"
        if self.renewed_ago is None:
            return client.V1LeaseList(items=[])
        spec = client.V1LeaseSpec(
            holder_identity="op-0",
            lease_duration_seconds=15,
            renew_time=self.now - timedelta(seconds=self.renewed_ago),
        )
        meta = client.V1ObjectMeta(namespace="gpu-efficiency-system", name="gpu-efficiency-operator")
        return client.V1LeaseList(items=[client.V1Lease(metadata=meta, spec=spec)])


@pytest.mark.parametrize(("renewed_ago", "running"), [(None, False), (3.0, True), (600.0, False)])
def test_a_running_operator_is_detected_by_its_lease(renewed_ago: float | None, running: bool) -> None:
    found = cl.operator_running(FakeLeases(renewed_ago), AT)
    assert bool(found) is running
    if running:
        assert found == "Lease gpu-efficiency-system/gpu-efficiency-operator is held by op-0, renewed 3s ago"


def test_cleanup_refuses_while_the_operator_runs_unless_forced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    core, custom = _world()
    monkeypatch.setattr("gpu_efficiency.cli_common.load_client", lambda args: None)
    monkeypatch.setattr(cl.client, "CoordinationV1Api", lambda _: FakeLeases(1.0, datetime.now(UTC)))
    monkeypatch.setattr(cl.client, "CoreV1Api", lambda _: core)
    monkeypatch.setattr(cl.client, "CustomObjectsApi", lambda _: custom)
    assert cli.main(["cleanup"]) == 1
    assert "gpu-efficiency cleanup: error: the operator is still running" in capsys.readouterr().err
    assert core.writes == []
    assert cli.main(["cleanup", "--dry-run"]) == 0  # writes nothing: runs beside the operator
    assert "gpu-efficiency restore deployment/llm -n team-a" in capsys.readouterr().out
    assert core.writes == []
    assert cli.main(["cleanup", "--force", "-o", "json"]) == 0
    assert '"restore": "gpu-efficiency restore deployment/llm -n team-a"' in capsys.readouterr().out
    assert core.writes != []
