"""The drain before a NoExecute fault taint: NoSchedule first, evictions through the Eviction API
(PodDisruptionBudget refusals retried), NoExecute once the pods are gone or the timeout passed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tests.unit.engine.quarantine.support import (
    DBE_ERROR,
    NAN,
    NOW,
    Cluster,
    counter,
    gpu,
    node,
    of_type,
    policy,
    record_of,
    shifted,
    snapshot,
    st,
)
from tests.unit.engine.quarantine.test_dra import XID_48, dra_gpus, dra_node, eight

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    AnnotateNode,
    DeviceRule,
    DeviceUse,
    DrainPod,
    FaultOutcome,
    GPUSample,
    NodeEvent,
    PodView,
    Signal,
    TaintDevices,
    TaintNode,
    Toleration,
    UntaintDevices,
)
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults

DRIVER = "gpu.nvidia.com"


def pod(name: str, node_name: str = "n1", **extra: Any) -> PodView:
    fields: dict[str, Any] = {
        "namespace": "team",
        "name": name,
        "uid": f"uid-{name}",
        "node": node_name,
        "phase": "Running",
        "labels": {},
        "annotations": {},
        "controller_kind": "ReplicaSet",
        "priority": 0,
        "start_time": NOW - 3600,
        "gpu_request": 1,
    }
    fields.update(extra)
    return PodView(**fields)


def holds(
    device: int, *pods: str, node_name: str = "n1", tolerations: tuple[Toleration, ...] = ()
) -> DeviceUse:
    return DeviceUse((DRIVER, node_name, f"gpu-{device}"), tuple(f"uid-{p}" for p in pods), tolerations)


@dataclass
class DrainCluster(Cluster):
    """Nodes, our DeviceTaintRules, pods and their claims; a DrainPod removes its pod unless a
    PodDisruptionBudget blocks it (``blocked``). ``failing`` action types are not applied, as when
    the API server refuses them."""

    devices: list[Any] = field(default_factory=list)
    rules: dict[tuple[str, str, str, str], DeviceRule] = field(default_factory=dict)
    pods: dict[str, PodView] = field(default_factory=dict)
    uses: list[DeviceUse] | None = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    failing: tuple[type, ...] = ()
    drained: list[str] = field(default_factory=list)  # every DrainPod the engine asked for

    def cycle(
        self, gpus: Iterable[GPUSample], *, advance: float = 60.0, metrics_available: bool = True
    ) -> FaultOutcome:
        snap = replace(
            snapshot(
                self.nodes.values(),
                [shifted(g, self.now - NOW) for g in gpus],
                spec=self.spec,
                now=self.now,
                metrics_available=metrics_available,
            ),
            pods=tuple(self.pods.values()),
            dra_devices=tuple(self.devices),
            device_rules=tuple(self.rules.values()),
            device_uses=None if self.uses is None else tuple(self.uses),
            protected_namespaces=frozenset({"kube-system"}),
        )
        outcome = evaluate_faults(snap)
        failed = [a for a in outcome.actions if isinstance(a, self.failing)]
        taint_failed = any(isinstance(a, TaintNode | TaintDevices) for a in failed)
        kept = [
            a
            for a in outcome.actions
            if a not in failed
            and not (
                taint_failed and names.NODE_FAULTS in getattr(a, "annotations", {})
            )  # the applier's rule
        ]
        self.apply(kept)
        for action in kept:
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
            elif isinstance(action, DrainPod):
                self.drained.append(action.name)
                if action.uid not in self.blocked:
                    self.pods.pop(action.name, None)
        self.now += advance
        return outcome

    def tainted_devices(self) -> list[str]:
        return sorted(f"{r.device}:{r.effect}" for r in self.rules.values())


NO_EXECUTE_DEVICES = policy(device_quarantine={"effect": "NoExecute"}, drain_timeout="5m")


def dra_cluster(spec: Any = NO_EXECUTE_DEVICES) -> DrainCluster:
    cluster = DrainCluster.of(dra_node("n1"), spec=spec)
    cluster.devices = dra_gpus("n1")
    cluster.pods = {p.name: p for p in (pod("victim"), pod("bystander"), pod("filler"))}
    cluster.uses = [holds(3, "victim"), holds(2, "bystander"), holds(0, "filler"), holds(1, "filler")]
    return cluster


def drains(outcome: FaultOutcome) -> list[str]:
    return [a.name for a in of_type(outcome.actions, DrainPod)]


def test_no_schedule_first_then_only_the_pod_on_the_faulty_gpu_then_no_execute() -> None:
    cluster = dra_cluster()
    first = cluster.cycle(eight("n1", g3=XID_48))
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    assert drains(first) == []  # nothing evicted before the soft form is seen in place

    second = cluster.cycle(eight("n1", g3=XID_48))  # the XID again, in a newer scrape: confirmed
    assert drains(second) == ["victim"]
    (action,) = of_type(second.actions, DrainPod)
    assert "GPU 3:GPU-n1-3" in action.reason
    assert "node n1 has a xid fault" in action.reason
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    assert record_of(cluster.nodes["n1"])["faults"]["xid"]["drainSince"]
    started = [e for e in of_type(second.actions, NodeEvent) if e.reason == names.EV_DRAIN]
    assert "Eviction API" in started[0].message

    third = cluster.cycle(eight("n1", g3=XID_48))  # the victim is gone: the hard stop
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]
    assert drains(third) == []
    assert sorted(cluster.pods) == ["bystander", "filler"]
    cluster.cycle(eight("n1", g3=XID_48))
    assert "drainSince" not in record_of(cluster.nodes["n1"])["faults"]["xid"]
    assert cluster.cycle(eight("n1", g3=XID_48)).actions == ()  # steady state: no write


def test_a_pdb_refusal_is_retried_every_cycle_until_the_timeout_upgrades() -> None:
    cluster = dra_cluster()
    cluster.blocked = {"uid-victim"}
    cluster.cycle(eight("n1", g3=XID_48))
    for _ in range(5):  # 0, 60, ... 240 s into the 5m drain
        assert drains(cluster.cycle(eight("n1", g3=XID_48))) == ["victim"]
        assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    last = cluster.cycle(eight("n1", g3=XID_48))  # 300 s: the timeout
    assert drains(last) == []
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]
    (over,) = [e for e in of_type(last.actions, NodeEvent) if e.reason == names.EV_DRAIN]
    assert "timeout passed with 1 pod(s) left: team/victim" in over.message
    assert set(cluster.drained) == {"victim"}  # the healthy GPUs' pods were never touched


def test_a_restarted_operator_resumes_the_drain_from_the_record() -> None:
    cluster = dra_cluster()
    cluster.blocked = {"uid-victim"}
    cluster.cycle(eight("n1", g3=XID_48))
    cluster.cycle(eight("n1", g3=XID_48))
    since = record_of(cluster.nodes["n1"])["faults"]["xid"]["drainSince"]
    restarted = dra_cluster()  # a new process: only the cluster's objects carry over
    restarted.blocked = {"uid-victim"}
    restarted.nodes, restarted.rules, restarted.now = cluster.nodes, cluster.rules, cluster.now + 240
    restarted.cycle(eight("n1", g3=XID_48))
    assert restarted.tainted_devices() == ["gpu-3:NoExecute"]  # 5 min after drainSince, not after the restart
    assert record_of(restarted.nodes["n1"])["faults"]["xid"]["drainSince"] == since


def test_a_node_taint_drains_the_nodes_gpu_pods_but_not_tolerating_or_protected_ones() -> None:
    spec = policy(ecc={"effect": "NoExecute"}, drain_timeout="5m")
    cluster = DrainCluster.of(node("n1"), spec=spec)
    tolerant = pod("tolerant", fault_tolerations=(Toleration(names.FAULT_TAINT_KEY, "Exists", "", ""),))
    system = pod("system", namespace="kube-system")
    cluster.pods = {p.name: p for p in (pod("plain"), tolerant, system, pod("elsewhere", "n2"))}
    cluster.uses = None  # claims unread: a node taint does not need them
    gpus = [gpu("n1", 0, fault=DBE_ERROR)]
    cluster.cycle(gpus)
    assert cluster.our_taint_values("n1") == ["ecc:NoSchedule"]
    assert drains(cluster.cycle(gpus)) == ["plain"]
    outcome = cluster.cycle(gpus)
    assert drains(outcome) == []  # the protected pod is waited for, never evicted
    assert cluster.our_taint_values("n1") == ["ecc:NoSchedule"]
    cluster.now += 300
    cluster.cycle(gpus)
    assert cluster.our_taint_values("n1") == ["ecc:NoExecute"]
    assert sorted(cluster.pods) == ["elsewhere", "system", "tolerant"]


def test_observe_mode_and_missing_metrics_never_evict() -> None:
    observe = dra_cluster(policy("Observe", device_quarantine={"effect": "NoExecute"}))
    for gpus in (eight("n1", g3=XID_48), eight("n1"), eight("n1")):
        assert drains(observe.cycle(gpus)) == []
    assert observe.tainted_devices() == []
    blind = dra_cluster()
    blind.cycle(eight("n1", g3=XID_48))
    assert drains(blind.cycle(eight("n1", g3=XID_48), metrics_available=False)) == []
    assert blind.tainted_devices() == ["gpu-3:NoSchedule"]


def test_forged_or_contradicting_series_never_evict() -> None:
    garbage = [
        {Signal.ECC_DBE_VOLATILE: counter(0, 1, resets=1)},
        {Signal.ECC_DBE_VOLATILE: counter(-5, 1)},
        {Signal.ECC_DBE_VOLATILE: st(NAN)},
        {Signal.XID: st(NAN, changes=1)},
        {Signal.XID: st(48, changes=1, age=900)},  # stale
    ]
    spec = policy(ecc={"effect": "NoExecute"}, device_quarantine={"effect": "NoExecute"})
    cluster = dra_cluster(spec)
    for _ in range(3):
        for fault in garbage:
            outcome = cluster.cycle([gpu("n1", i, fault=fault if i == 3 else None) for i in range(8)])
            assert drains(outcome) == []
    assert cluster.tainted_devices() == []
    assert len(cluster.pods) == 3


def test_unread_claims_evict_nothing_and_wait_for_the_timeout() -> None:
    cluster = dra_cluster()
    cluster.uses = None
    cluster.cycle(eight("n1", g3=XID_48))
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == []
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]  # not "every pod is gone"
    cluster.now += 300
    cluster.cycle(eight("n1", g3=XID_48))
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]


def test_a_claim_tolerating_the_device_taint_is_left_alone() -> None:
    cluster = dra_cluster()
    cluster.uses = [
        holds(3, "victim", tolerations=(Toleration(names.FAULT_TAINT_KEY, "Exists", "", "NoExecute"),))
    ]
    cluster.cycle(eight("n1", g3=XID_48))
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == []
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]


def test_a_zero_timeout_sets_no_execute_at_once() -> None:
    cluster = dra_cluster(policy(device_quarantine={"effect": "NoExecute"}, drain_timeout="0s"))
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == []
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]  # one reading: no NoExecute yet (safety rule 9)
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == []  # the next scrape shows it again
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]


def test_api_errors_at_each_step_leave_a_state_the_next_cycle_finishes() -> None:
    # 1. The soft taint is refused: no eviction, no drain clock; retried next cycle.
    cluster = dra_cluster()
    cluster.failing = (TaintDevices,)
    cluster.cycle(eight("n1", g3=XID_48))
    assert cluster.tainted_devices() == []
    cluster.failing = ()
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == []  # the XID still in the lookback
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    # 2. The eviction fails (the pod stays) and the record write with drainSince fails too.
    cluster.failing = (DrainPod, AnnotateNode)
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == ["victim"]
    assert "drainSince" not in record_of(cluster.nodes["n1"]).get("faults", {}).get("xid", {})
    cluster.failing = (DrainPod,)
    assert drains(cluster.cycle(eight("n1", g3=XID_48))) == ["victim"]  # retried; the clock starts now
    assert record_of(cluster.nodes["n1"])["faults"]["xid"]["drainSince"]
    # 3. The eviction goes through, the upgrade to NoExecute is refused: retried next cycle.
    cluster.failing = ()
    cluster.cycle(eight("n1", g3=XID_48))
    cluster.failing = (TaintDevices,)
    cluster.cycle(eight("n1", g3=XID_48))
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    cluster.failing = ()
    cluster.cycle(eight("n1", g3=XID_48))
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]
    assert sorted(cluster.pods) == ["bystander", "filler"]
