"""DeviceTaintRule reads and writes: only ours, only the difference, idempotent across replicas."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.dra import taint_devices, untaint_devices
from gpu_efficiency.api.names import FAULT_TAINT_KEY
from gpu_efficiency.engine.model import DraDevice, TaintDevices, UntaintDevices
from gpu_efficiency.engine.outcomes import Result
from gpu_efficiency.objects.dra import (
    parse_claims,
    parse_rules,
    parse_slices,
    rule_body,
    rule_name,
)
from gpu_efficiency.sources.kube.dra import DraReader

GPU3 = DraDevice("gpu.nvidia.com", "n1", "gpu-3", "n1", "GPU-3")
GPU5 = DraDevice("gpu.nvidia.com", "n1", "gpu-5", "n1", "GPU-5")


class FakeRules:
    """An API server's DeviceTaintRules and ResourceSlices, with a call log."""

    def __init__(self, slices: list[dict[str, Any]] | None = None, fail: int | None = None) -> None:
        self.rules: dict[str, dict[str, Any]] = {}
        self.slices = slices or []
        self.claims: list[dict[str, Any]] = []
        self.fail_claims: int | None = None
        self.fail = fail
        self.writes: list[str] = []

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> Any:
        if self.fail is not None:
            raise ApiException(status=self.fail, reason="nope")
        if plural == "resourceslices":
            return {"items": self.slices}
        if plural == "resourceclaims":
            if self.fail_claims is not None:
                raise ApiException(status=self.fail_claims, reason="nope")
            return {"items": self.claims}
        wanted = dict(p.split("=", 1) for p in (label_selector or "").split(",") if p)
        return {
            "items": [
                r
                for r in self.rules.values()
                if all(r["metadata"]["labels"].get(k) == v for k, v in wanted.items())
            ]
        }

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: Any) -> Any:
        name = body["metadata"]["name"]
        if name in self.rules:
            raise ApiException(status=409, reason="AlreadyExists")
        self.rules[name] = body
        self.writes.append(f"create {name}")
        return body

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any) -> Any:
        self.rules[name]["spec"]["taint"].update(body["spec"]["taint"])
        self.writes.append(f"patch {name}")
        return self.rules[name]

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> Any:
        self.rules.pop(name)
        self.writes.append(f"delete {name}")
        return {}


def test_rules_are_created_once_then_left_alone() -> None:
    api = FakeRules()
    first = taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    assert first.result is Result.DONE
    assert api.writes == [f"create {rule_name('xid', GPU3)}"]
    body = api.rules[rule_name("xid", GPU3)]
    assert body["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}
    assert body["spec"]["taint"] == {
        "key": "gpuefficiency.io/gpu-fault",
        "value": "xid",
        "effect": "NoSchedule",
    }
    again = taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    assert again.result is Result.NOOP
    assert len(api.writes) == 1


def test_the_difference_is_written_effect_and_devices() -> None:
    api = FakeRules()
    taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    changed = taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoExecute", devices=(GPU5,)))
    assert changed.result is Result.DONE
    assert sorted(api.writes[1:]) == sorted(
        [f"create {rule_name('xid', GPU5)}", f"delete {rule_name('xid', GPU3)}"]
    )
    taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU5,)))
    assert api.writes[-1] == f"patch {rule_name('xid', GPU5)}"
    assert api.rules[rule_name("xid", GPU5)]["spec"]["taint"]["effect"] == "NoSchedule"


def test_another_replicas_create_counts_as_done() -> None:
    api = FakeRules()
    api.rules[rule_name("xid", GPU3)] = rule_body("xid", "NoSchedule", GPU3)
    api.rules[rule_name("xid", GPU3)]["metadata"]["labels"] = {}  # not seen by our list yet
    outcome = taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    assert outcome.result is Result.DONE
    assert api.writes == []


def test_untaint_deletes_only_our_rules_of_the_node_and_kind() -> None:
    api = FakeRules()
    taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    other = DraDevice("gpu.nvidia.com", "n2", "gpu-3", "n2", "GPU-x")
    taint_devices(api, TaintDevices(node="n2", kind="xid", effect="NoSchedule", devices=(other,)))
    foreign = rule_body("xid", "NoExecute", GPU5)
    foreign["metadata"] = {"name": "admins", "labels": {"team": "infra"}}
    api.rules["admins"] = foreign
    outcome = untaint_devices(api, UntaintDevices(node="n1", kind="xid"))
    assert outcome.result is Result.DONE
    assert sorted(api.rules) == sorted(["admins", rule_name("xid", other)])
    assert untaint_devices(api, UntaintDevices(node="n1", kind="xid")).result is Result.NOOP


def test_a_failed_write_is_reported() -> None:
    outcome = taint_devices(
        FakeRules(fail=500), TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,))
    )
    assert outcome.result is Result.FAILED


def test_rule_names_are_valid_and_bounded() -> None:
    long = DraDevice("gpu.nvidia.com", "p", "gpu-0", "Node_" + "x" * 300, "u")
    name = rule_name("xid", long)
    assert len(name) <= 253
    assert name == name.lower()
    assert "_" not in name
    assert rule_name("xid", GPU3) != rule_name(
        "xid", DraDevice("other.example.com", "n1", "gpu-3", "n1", "u")
    )


def slice_(node: str, generation: int, *devices: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation},
            "devices": [{"name": n, "attributes": a} for n, a in devices],
        }
    }


def test_slices_give_gpus_with_a_uuid_from_the_newest_pool_generation() -> None:
    devices = parse_slices(
        [
            slice_("n1", 1, ("gpu-0", {"uuid": {"string": "GPU-old"}})),
            slice_("n1", 2, ("gpu-0", {"uuid": {"string": "GPU-a"}}), ("nic", {"model": {"string": "x"}})),
            slice_("n2", 1, ("gpu-0", {"gpu.nvidia.com/uuid": {"string": "GPU-b"}})),
            {"spec": {"driver": "d", "pool": {"name": "net"}, "devices": [{"name": "x"}]}},  # not node-local
        ]
    )
    assert [(d.node, d.device, d.uuid) for d in devices] == [
        ("n1", "gpu-0", "GPU-a"),
        ("n2", "gpu-0", "GPU-b"),
    ]


def test_only_our_rules_are_read() -> None:
    ours = rule_body("xid", "NoSchedule", GPU3)
    theirs = rule_body("xid", "NoSchedule", GPU5)
    theirs["metadata"]["labels"] = {}
    (rule,) = parse_rules([ours, theirs])
    assert (rule.node, rule.kind, rule.key, rule.effect) == ("n1", "xid", GPU3.key, "NoSchedule")


@pytest.mark.parametrize("status", [403, 404])
def test_an_api_not_served_or_not_allowed_means_node_taints(status: int) -> None:
    state = DraReader(FakeRules(fail=status)).read()
    assert state.devices == ()
    assert state.rules == ()
    assert not state.blind
    assert state.error


def test_a_failed_read_keeps_the_last_good_one_or_is_blind() -> None:
    api = FakeRules(slices=[slice_("n1", 1, ("gpu-0", {"uuid": {"string": "GPU-a"}}))])
    taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    assert DraReader(FakeRules(fail=500)).read().blind
    reader = DraReader(api)
    good = reader.read()
    api.fail = 500
    stale = reader.read()
    assert (stale.devices, stale.rules) == (good.devices, good.rules)
    assert len(good.rules) == 1
    assert not stale.blind
    assert "500" in stale.error


def counted(api: FakeRules) -> list[str]:
    """The plurals ``api`` is asked to LIST, in order."""
    calls: list[str] = []
    listed = api.list_cluster_custom_object

    def counting(group: str, version: str, plural: str, *, label_selector: str | None = None) -> Any:
        calls.append(plural)
        return listed(group, version, plural, label_selector=label_selector)

    api.list_cluster_custom_object = counting  # type: ignore[method-assign]
    return calls


def test_slices_are_listed_once_a_minute_our_rules_every_cycle_where_dra_gpus_exist() -> None:
    api = FakeRules(slices=[slice_("n1", 1, ("gpu-0", {"uuid": {"string": "GPU-a"}}))])
    calls = counted(api)
    now = [0.0]
    reader = DraReader(api, clock=lambda: now[0])
    for t in (0.0, 5.0, 59.0, 60.0):
        now[0] = t
        assert [d.uuid for d in reader.read().devices] == ["GPU-a"]
    assert calls.count("resourceslices") == 2
    assert calls.count("devicetaintrules") == 4
    assert reader.requests == 6


def test_a_cluster_without_dra_gpus_costs_no_read_in_a_steady_cycle() -> None:
    """No GPU in any slice and no rule of ours: both are asked again only when the slices are due,
    so the steady cycle of a device-plugin cluster makes no API request for DRA."""
    api = FakeRules(slices=[])
    calls = counted(api)
    now = [0.0]
    reader = DraReader(api, clock=lambda: now[0])
    for t in (0.0, 5.0, 30.0, 59.0, 60.0, 65.0):
        now[0] = t
        assert reader.read().devices == ()
    assert calls == ["devicetaintrules", "resourceslices"] * 2
    assert reader.requests == 4


@pytest.mark.parametrize("status", [403, 404])
def test_not_served_is_asked_again_once_a_minute_not_every_cycle(status: int) -> None:
    api = FakeRules(fail=status)
    calls = counted(api)
    now = [0.0]
    reader = DraReader(api, clock=lambda: now[0])
    for t in (0.0, 5.0, 59.0, 60.0):
        now[0] = t
        assert reader.read().error
    assert len(calls) == 2


def claim(uid: str, *devices: str, tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    results = [
        {
            "request": "gpus",
            "driver": "gpu.nvidia.com",
            "pool": "n1",
            "device": d,
            "tolerations": tolerations or [],
        }
        for d in devices
    ]
    return {
        "metadata": {"name": f"c-{uid}", "namespace": "team"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": uid, "uid": uid}],
        },
    }


def test_claims_name_the_pods_holding_each_device_with_the_tolerations_that_matter() -> None:
    mine = {"key": FAULT_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
    other = {"key": "example.com/x", "operator": "Exists"}
    uses = parse_claims([claim("u1", "gpu-3", "gpu-4", tolerations=[mine, other]), {"status": {}}])
    assert [(u.key[2], u.pods) for u in uses] == [("gpu-3", ("u1",)), ("gpu-4", ("u1",))]
    assert [t.key for t in uses[0].tolerations] == [FAULT_TAINT_KEY]


def test_claims_are_read_only_while_a_rule_of_ours_exists_and_a_failed_read_is_unknown() -> None:
    api = FakeRules(slices=[slice_("n1", 1, ("gpu-3", {"uuid": {"string": "GPU-3"}}))])
    api.claims = [claim("u1", "gpu-3")]
    calls = counted(api)
    reader = DraReader(api)
    assert reader.with_claims(reader.read()).uses == ()
    assert "resourceclaims" not in calls
    taint_devices(api, TaintDevices(node="n1", kind="xid", effect="NoSchedule", devices=(GPU3,)))
    assert reader.read().uses == ()  # read alone never lists claims (only a NoExecute policy asks)
    assert "resourceclaims" not in calls
    state = reader.with_claims(reader.read())
    assert [u.pods for u in state.uses or ()] == [("u1",)]
    api.fail_claims = 500
    failed = reader.with_claims(reader.read())
    assert failed.uses is None
    assert len(failed.rules) == 1
    assert not failed.blind
