"""Fault quarantine steps the scenario format cannot express (issue 4), on the real local cluster.

Each test runs a scenario of ``scenarios/procedural/`` in the background (nodes, simulator faults,
policy, the operator as a process with the chart's RBAC) and acts on the cluster meanwhile: it
times the taint against Prometheus, submits pods after the taint to the real scheduler, and plays
the admin (``kubectl annotate``/``kubectl taint``). The automatic parts (taint within deadlines,
breaker, garbage, thermal recovery, others' taints) are scenario files run by test_scenarios.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.harness import Cluster, OperatorIdentity, gpu_condition, prom_query, wait_for
from tests.e2e.scenario_driver import BackgroundScenario, node_events, node_taints

pytestmark = pytest.mark.e2e

KEY = "gpuefficiency.io/gpu-fault"
INTERVAL_S = 5.0  # the procedural scenarios' policy interval
SCENARIO_LABEL = "sim.gpuefficiency.io/scenario"


def ours(core: client.CoreV1Api, node: str) -> list[tuple[str, str, str]]:
    return [t for t in node_taints(core, node) if t[0] == KEY]


def unhealthy(core: client.CoreV1Api, node: str) -> Any:
    """The node's GPUHealthy condition while it is False, else None."""
    cond = gpu_condition(core, node)
    return cond if cond is not None and cond.status == "False" else None


def gpu_deployment(
    name: str, scenario: str, *, node: str | None = None, tolerate: bool = False
) -> dict[str, Any]:
    """A one-GPU Deployment for the scenario's nodes; optionally pinned to one, or tolerating our taint."""
    selector: dict[str, str] = {SCENARIO_LABEL: scenario}
    if node is not None:
        selector["kubernetes.io/hostname"] = node
    tolerations: list[dict[str, str]] = [
        {"key": SCENARIO_LABEL, "operator": "Equal", "value": scenario, "effect": "NoSchedule"}
    ]
    if tolerate:
        tolerations.append({"key": KEY, "operator": "Exists"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {"sim.gpuefficiency.io/profile": "idle"},
                },
                "spec": {
                    "nodeSelector": selector,
                    "tolerations": tolerations,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def pods_of(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"app={app}").items)


def test_ecc_taints_within_one_interval_and_the_scheduler_keeps_new_gpu_pods_away(
    cluster: Cluster,
    k8s: client.ApiClient,
    operator_identity: OperatorIdentity,
    namespace: str,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    faulty, healthy = "sched-gpu-0", "sched-gpu-1"
    with BackgroundScenario("ecc-scheduling", cluster, operator_identity, tmp_path) as bg:
        # 1. Time the taint against the first sample of the error in Prometheus (the fault is at 25s).
        series = (
            f'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{simulator="{bg.run.target_name}", Hostname="{faulty}", gpu="1"}}'
        )
        sampled = tainted = None
        uuid = ""
        deadline = time.monotonic() + 60
        while tainted is None and time.monotonic() < deadline:
            if sampled is None:
                found = [labels for labels, value in prom_query(cluster.prometheus_url, series) if value > 0]
                if found:
                    sampled, uuid = time.monotonic(), found[0]["UUID"]
            if ours(core, faulty):
                tainted = time.monotonic()
            time.sleep(0.2)
        assert sampled is not None, "Prometheus never had the ECC sample:\n" + bg.report()
        assert tainted is not None, "the node was never tainted:\n" + bg.report()
        assert ours(core, faulty) == [(KEY, "ecc", "NoSchedule")]
        delay = tainted - sampled
        # one interval, plus the cycle's own time and this loop's polling
        assert delay <= INTERVAL_S + 2, f"taint {delay:.1f}s after Prometheus had the sample (interval 5s)"
        assert bg.elapsed() < 45

        # 2. The condition and the events name the GPU: index and UUID.
        cond = wait_for(lambda: gpu_condition(core, faulty), 15, what="GPUHealthy condition")
        assert (cond.status, cond.reason) == ("False", "GPUFaultECC")
        assert f"GPU 1:{uuid}" in cond.message, cond.message
        detected = wait_for(
            lambda: node_events(core, faulty, "GPUFaultDetected"), 15, what="GPUFaultDetected"
        )
        assert any(f"GPU 1:{uuid}" in (e.message or "") for e in detected), [e.message for e in detected]
        assert wait_for(lambda: node_events(core, faulty, "NodeTainted"), 15, what="NodeTainted")

        # 3. New pods after the taint, through the real scheduler.
        scenario = bg.run.name
        apps.create_namespaced_deployment(namespace, gpu_deployment("pinned", scenario, node=faulty))
        apps.create_namespaced_deployment(
            namespace, gpu_deployment("tolerant", scenario, node=faulty, tolerate=True)
        )
        apps.create_namespaced_deployment(namespace, gpu_deployment("free", scenario))

        def running(app: str) -> client.V1Pod | None:
            pods = [p for p in pods_of(core, namespace, app) if p.status.phase == "Running"]
            return pods[0] if pods else None

        tolerant = wait_for(lambda: running("tolerant"), 60, what="the tolerating pod Running")
        assert tolerant.spec.node_name == faulty, "a pod tolerating the taint may use the node"
        free = wait_for(lambda: running("free"), 60, what="the unpinned pod Running")
        assert free.spec.node_name == healthy, "a new GPU pod lands on the healthy node"

        def refused() -> list[str]:
            pods = pods_of(core, namespace, "pinned")
            if not pods:
                return []
            events = core.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.name={pods[0].metadata.name},reason=FailedScheduling",
            ).items
            return [e.message for e in events if "untolerated taint" in (e.message or "")]

        # The scheduler no longer names the taint in its message; the pinned pod differs from the
        # tolerant one (Running on the same node) only by not tolerating our taint, and the node's
        # other taint (the scenario's isolation) it tolerates: our taint is what keeps it off.
        wait_for(refused, 60, what="FailedScheduling for an untolerated taint")
        time.sleep(3)
        pinned = pods_of(core, namespace, "pinned")
        assert len(pinned) == 1
        assert pinned[0].status.phase == "Pending"
        assert not pinned[0].spec.node_name
        assert ours(core, faulty) == [(KEY, "ecc", "NoSchedule")], "ECC recovery is manual: the taint stays"
    result = bg.finish()
    assert result.passed, bg.report()


def test_manual_recovery_and_a_manual_untaint_are_respected_until_a_new_fault(
    cluster: Cluster,
    k8s: client.ApiClient,
    operator_identity: OperatorIdentity,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(k8s)
    xid_node, ecc_node = "admin-gpu-0", "admin-gpu-1"
    with BackgroundScenario("fault-admin", cluster, operator_identity, tmp_path) as bg:
        wait_for(lambda: ours(core, xid_node) and ours(core, ecc_node), 40, what="both nodes tainted")
        assert ours(core, xid_node) == [(KEY, "xid", "NoSchedule")]
        assert ours(core, ecc_node) == [(KEY, "ecc", "NoSchedule")]
        # The condition is written after the taint, in the same cycle: it may land a moment later.
        cond = wait_for(lambda: unhealthy(core, xid_node), 10, what="GPUHealthy=False on the XID node")
        assert "gpuefficiency.io/fault-recovered=xid" in cond.message, "the condition says how to recover"

        # The admin: the XID node is repaired (annotation); the ECC node's taint is removed by hand.
        cluster.kubectl_run("annotate", "node", xid_node, "gpuefficiency.io/fault-recovered=xid")
        cluster.kubectl_run("taint", "node", ecc_node, f"{KEY}-")
        acted = bg.elapsed()

        untainted = wait_for(
            lambda: node_events(core, xid_node, "NodeUntainted"), 20, what="NodeUntainted after recovery"
        )
        assert any("fault-recovered=xid" in (e.message or "") for e in untainted), [
            e.message for e in untainted
        ]
        respected = wait_for(
            lambda: node_events(core, ecc_node, "NodeUntainted"), 20, what="the manual untaint acknowledged"
        )
        assert any("removed by someone else" in (e.message or "") for e in respected)

        # Hold past the lookback (30s) plus an interval, with the XID still 79 in the gauge and the
        # ECC counter still raised: neither node is tainted again for the same fault. The second ECC
        # error comes at 75s.
        end = 73.0
        assert end - acted >= 30 + INTERVAL_S, f"the admin acted too late ({acted:.0f}s) to prove the hold"
        while bg.elapsed() < end:
            assert not ours(core, xid_node), f"re-tainted at {bg.elapsed():.0f}s for the same XID"
            assert not ours(core, ecc_node), f"re-tainted at {bg.elapsed():.0f}s after the admin's untaint"
            time.sleep(1)
        xid = prom_query(
            cluster.prometheus_url,
            f'DCGM_FI_DEV_XID_ERRORS{{simulator="{bg.run.target_name}", Hostname="{xid_node}", gpu="1"}}',
        )
        assert [value for _, value in xid] == [79], "the XID stayed in the gauge"
        annotations = core.read_node(xid_node).metadata.annotations or {}
        assert "gpuefficiency.io/fault-recovered" not in annotations, "the request is consumed"
        healed = gpu_condition(core, xid_node)
        assert healed is not None
        assert healed.status == "True", "GPUHealthy back to True after recovery"

        # A new ECC error at 75s is a new fault: the node is tainted again.
        bg.sleep_until(75)
        wait_for(lambda: ours(core, ecc_node), 20, what="a taint for the new ECC error")
    result = bg.finish()
    assert result.passed, bg.report()
