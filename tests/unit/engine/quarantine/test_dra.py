"""Single-GPU quarantine on DRA nodes: a reset-class XID taints the device, not the node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tests.unit.engine.quarantine.support import (
    NOW,
    Cluster,
    gpu,
    node,
    of_type,
    policy,
    record_of,
    shifted,
    snapshot,
    st,
)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    DeviceRule,
    DraDevice,
    FaultOutcome,
    GPUSample,
    NodeEvent,
    SetNodeCondition,
    Signal,
    TaintDevices,
    TaintNode,
    UntaintDevices,
    UntaintNode,
)
from gpu_efficiency.engine.quarantine.dra import single_gpu, with_dra_capacity
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults
from gpu_efficiency.engine.quarantine.record import FaultEntry, GpuFault

DRIVER = "gpu.nvidia.com"
XID_48 = {Signal.XID: st(48, low=0, high=48, changes=1)}  # double-bit ECC: reset-gpu class
XID_62 = {Signal.XID: st(62, low=0, high=62, changes=1)}  # PMU halted: reset-gpu class
XID_79 = {Signal.XID: st(79, low=0, high=79, changes=1)}  # fallen off the bus: reboot-node class


def dra_gpus(name: str, count: int = 8) -> list[DraDevice]:
    return [DraDevice(DRIVER, name, f"gpu-{i}", name, f"GPU-{name}-{i}") for i in range(count)]


@dataclass
class DraCluster(Cluster):
    """The fault harness plus ResourceSlices' GPUs and our DeviceTaintRules, evolved by the actions."""

    devices: list[DraDevice] = field(default_factory=list)
    rules: dict[tuple[str, str, str, str], DeviceRule] = field(default_factory=dict)  # (kind, *key)

    def cycle(
        self, gpus: Iterable[GPUSample], *, advance: float = 60.0, metrics_available: bool = True
    ) -> FaultOutcome:
        snap = replace(
            snapshot(
                self.nodes.values(),
                [shifted(g, self.now - NOW) for g in gpus],
                spec=self.spec,
                now=self.now,
                conditions=[self.breaker] if self.breaker is not None else [],
                metrics_available=metrics_available,
            ),
            dra_devices=tuple(self.devices),
            device_rules=tuple(self.rules.values()),
        )
        outcome = evaluate_faults(snap)
        self.apply(outcome.actions)
        for action in outcome.actions:
            if isinstance(action, TaintDevices):
                for key in [
                    k for k, r in self.rules.items() if (r.node, r.kind) == (action.node, action.kind)
                ]:
                    del self.rules[key]
                for d in action.devices:
                    self.rules[(action.kind, *d.key)] = DeviceRule(
                        f"r-{d.device}", d.node, action.kind, d.driver, d.pool, d.device, action.effect
                    )
            elif isinstance(action, UntaintDevices):
                for key in [
                    k for k, r in self.rules.items() if (r.node, r.kind) == (action.node, action.kind)
                ]:
                    del self.rules[key]
        self.now += advance
        return outcome

    def tainted_devices(self) -> list[str]:
        return sorted(f"{r.device}:{r.effect}" for r in self.rules.values())


def dra_node(name: str) -> Any:
    return node(name, gpus=0)  # a DRA driver publishes no nvidia.com/gpu capacity


def eight(name: str, **faults: dict[Signal, Any]) -> list[GPUSample]:
    return [gpu(name, i, fault=faults.get(f"g{i}")) for i in range(8)]


def test_a_reset_class_xid_on_a_dra_node_taints_that_device_only() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1")
    outcome = cluster.cycle(eight("n1", g3=XID_48))
    (taint,) = of_type(outcome.actions, TaintDevices)
    assert (taint.node, taint.kind, taint.effect) == ("n1", "xid", "NoSchedule")
    assert [d.device for d in taint.devices] == ["gpu-3"]
    assert of_type(outcome.actions, TaintNode) == []
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    assert cluster.our_taint_values("n1") == []
    tainted = [e for e in of_type(outcome.actions, NodeEvent) if e.reason == names.EV_TAINTED]
    assert "gpu.nvidia.com/n1/gpu-3" in tainted[0].message
    assert "healthy GPUs" in tainted[0].message
    (condition,) = of_type(outcome.actions, SetNodeCondition)
    assert condition.status == "False"
    assert "GPU 3:GPU-n1-3" in condition.message
    assert record_of(cluster.nodes["n1"])["faults"]["xid"]["tainted"] is True
    steady = cluster.cycle(eight("n1"))
    assert of_type(steady.actions, TaintDevices) == []
    assert of_type(steady.actions, UntaintDevices) == []
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]


def test_no_execute_when_the_policy_says_so() -> None:
    spec = policy(device_quarantine={"effect": "NoExecute"})
    cluster = DraCluster.of(dra_node("n1"), spec=spec)
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_62))
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]  # drained first (test_drain)
    cluster.cycle(eight("n1", g3=XID_62))  # seen again, no pod holds the device: nothing to wait for
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]


def test_a_device_plugin_node_and_a_reboot_class_xid_keep_the_node_taint() -> None:
    cluster = DraCluster.of(
        node("plugin"), dra_node("n1"), spec=policy(circuit_breaker={"max_tainted_fraction": 1})
    )
    cluster.devices = dra_gpus("n1")
    outcome = cluster.cycle([*eight("plugin", g3=XID_48), *eight("n1", g2=XID_79)])
    assert sorted(a.node for a in of_type(outcome.actions, TaintNode)) == ["n1", "plugin"]
    assert of_type(outcome.actions, TaintDevices) == []


def test_turned_off_the_node_is_tainted() -> None:
    cluster = DraCluster.of(dra_node("n1"), spec=policy(device_quarantine={"enabled": False}))
    cluster.devices = dra_gpus("n1")
    outcome = cluster.cycle(eight("n1", g3=XID_48))
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]
    assert of_type(outcome.actions, TaintDevices) == []


def test_observe_mode_taints_no_device() -> None:
    cluster = DraCluster.of(dra_node("n1"), spec=policy(mode="Observe"))
    cluster.devices = dra_gpus("n1")
    outcome = cluster.cycle(eight("n1", g3=XID_48))
    assert of_type(outcome.actions, TaintDevices) == []
    assert cluster.tainted_devices() == []


def test_recovery_removes_the_rule_and_then_forgets_the_fault() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_48))
    cluster.annotate("n1", names.FAULT_RECOVERED, "xid")
    recovered = cluster.cycle(eight("n1"))
    assert of_type(recovered.actions, UntaintDevices) == [UntaintDevices(node="n1", kind="xid")]
    assert of_type(recovered.actions, UntaintNode) == []
    assert cluster.tainted_devices() == []
    cluster.cycle(eight("n1"))
    assert "xid" not in record_of(cluster.nodes["n1"]).get("faults", {})


def test_automatic_recovery_removes_the_rule() -> None:
    spec = policy(xid={"recovery": "Automatic", "recovery_after": "1m"})
    cluster = DraCluster.of(dra_node("n1"), spec=spec)
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_48))
    outcomes = [cluster.cycle(eight("n1")) for _ in range(4)]
    assert [a for o in outcomes for a in of_type(o.actions, UntaintDevices)] == [
        UntaintDevices(node="n1", kind="xid")
    ]
    assert cluster.tainted_devices() == []


def test_a_rule_an_admin_deleted_is_respected() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_48))
    cluster.rules.clear()
    noticed = cluster.cycle(eight("n1"))
    assert of_type(noticed.actions, TaintDevices) == []
    assert record_of(cluster.nodes["n1"])["faults"]["xid"]["manualUntaint"] is True


def test_a_second_faulty_gpu_joins_the_quarantine() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_48))
    cluster.cycle(eight("n1", g5=XID_62))
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule", "gpu-5:NoSchedule"]


def test_a_node_wide_fault_after_a_device_fault_moves_the_quarantine_to_the_node() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1")
    cluster.cycle(eight("n1", g3=XID_48))
    moved = cluster.cycle(eight("n1", g5=XID_79))
    kinds = [type(a) for a in moved.actions if isinstance(a, (TaintNode, UntaintDevices))]
    assert kinds == [TaintNode, UntaintDevices], "the node taint is set before the device rules go"
    assert cluster.tainted_devices() == []
    assert cluster.our_taint_values("n1") == ["xid:NoSchedule"]


def test_a_gpu_no_slice_lists_keeps_the_node_taint() -> None:
    cluster = DraCluster.of(dra_node("n1"))
    cluster.devices = dra_gpus("n1", count=3)  # GPU 3 is not a DRA device
    outcome = cluster.cycle(eight("n1", g3=XID_48))
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]


def test_a_device_tainted_node_counts_against_the_circuit_breaker() -> None:
    spec = policy(circuit_breaker={"max_tainted_nodes": 1, "max_tainted_fraction": 1.0})
    cluster = DraCluster.of(dra_node("n1"), dra_node("n2"), spec=spec)
    cluster.devices = dra_gpus("n1") + dra_gpus("n2")
    cluster.cycle(eight("n1", g3=XID_48))
    denied = cluster.cycle([*eight("n1"), *eight("n2", g1=XID_48)])
    assert of_type(denied.actions, TaintDevices) == []
    assert denied.breaker_open
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]


def test_single_gpu_needs_a_reset_class_xid_on_every_gpu() -> None:
    def entry(*codes: float) -> FaultEntry:
        gpus = tuple(GpuFault(str(i), f"u{i}", "", {"xid": c}) for i, c in enumerate(codes))
        return FaultEntry(since="t", detected="t", gpus=gpus)

    assert single_gpu("xid", entry(48, 62))
    assert not single_gpu("xid", entry(48, 79))
    assert not single_gpu("ecc", entry(48))
    assert not single_gpu("xid", entry())


def test_dra_only_nodes_count_their_slices_gpus() -> None:
    views = with_dra_capacity([dra_node("n1"), node("p1", gpus=4)], dra_gpus("n1") + dra_gpus("p1", 2))
    assert [v.gpu_capacity for v in views] == [8, 4]
