"""Single-GPU quarantine with DRA device taints on the real local cluster (issue 22).

The scenario ``procedural/dra-quarantine.yaml`` sets the stage (a DRA node whose ResourceSlice the
simulator publishes, a device-plugin node, three claim pods, the policy with NoExecute device
taints) and checks the node taint, the events and that the DRA node stays untainted; this test
injects the XID on the GPU the scheduler really gave the victim and checks what the scenario
format cannot: the DeviceTaintRule (NoSchedule first), the drain before NoExecute (the victim's
PodDisruptionBudget refuses its eviction, so the rule turns NoExecute only at drainTimeout, and the
controller-manager then removes only the victim), a new 4-GPU claim on the healthy GPUs, the
rule's removal on recovery, and that steady cycles read the slices and our rules from watches (no
API read). Needs the cluster's DRA device taints (cluster.sh turns them on by default:
GPUEFF_RUNTIME_CONFIG, GPUEFF_FEATURE_GATES).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency_sim.allocation import claim_devices
from gpu_efficiency_sim.faults import Fault, FaultKind
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario

pytestmark = pytest.mark.e2e

NODE = "dra-gpu-0"
RESOURCE = ("resource.k8s.io", "v1")
RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")
OURS = "app.kubernetes.io/managed-by=gpu-efficiency-operator"
SCENARIO_LABEL = "sim.gpuefficiency.io/scenario"
READS = re.compile(r"policy dra-quarantine: cycle [^\n]*?, (\d+) API reads")


def our_rules(custom: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = custom.list_cluster_custom_object(*RULES, label_selector=OURS)["items"]
    return [r for r in items if r["metadata"].get("annotations", {}).get("gpuefficiency.io/node") == NODE]


def pod_devices(custom: Any, core: client.CoreV1Api, namespace: str) -> dict[str, tuple[int, ...]]:
    """Pod name -> the GPU indexes its claims were allocated."""
    claims = custom.list_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")["items"]
    by_uid = claim_devices(claims)
    return {
        p.metadata.name: by_uid.get(p.metadata.uid, ()) for p in core.list_namespaced_pod(namespace).items
    }


def big_claim_pod(custom: Any, core: client.CoreV1Api, namespace: str, scenario: str) -> None:
    """A pod asking for 4 GPUs of the DRA node through a claim template."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "four-gpus"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "allocationMode": "ExactCount",
                                "count": 4,
                            },
                        }
                    ]
                }
            }
        },
    }
    custom.create_namespaced_custom_object(*RESOURCE, namespace, "resourceclaimtemplates", template)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "newcomer", "annotations": {"sim.gpuefficiency.io/profile": "idle"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [
                {"key": SCENARIO_LABEL, "operator": "Equal", "value": scenario, "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}],
            "containers": [
                {
                    "name": "cuda",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)


def test_a_reset_class_xid_on_a_dra_gpu_quarantines_that_device_only(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    custom: Any = client.CustomObjectsApi(k8s)
    try:
        custom.list_cluster_custom_object(*RULES)
    except ApiException as exc:
        pytest.fail(
            f"DeviceTaintRules are not served ({exc.status}): start the cluster with "
            "GPUEFF_RUNTIME_CONFIG=resource.k8s.io/v1beta2=true GPUEFF_FEATURE_GATES=DRADeviceTaintRules=true"
        )
    with BackgroundScenario("dra-quarantine", cluster, operator_identity, tmp_path) as bg:
        ns = bg.namespace("sim-dra")
        # 1. The scheduler allocated the claims: find the victim's GPU and inject XID 48 there at 25s.
        devices = wait_for(
            lambda: (
                (d := pod_devices(custom, core, ns))
                and all(d.get(p) for p in ("filler", "bystander", "victim"))
                and d
            ),
            60,
            what="the three claims allocated",
        )
        (gpu,) = devices["victim"]
        assert sorted(devices["filler"] + devices["bystander"] + devices["victim"]) == sorted(
            {*devices["filler"], *devices["bystander"], gpu}
        ), f"claims share a GPU: {devices}"
        uids = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(ns).items}
        pdb = client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="victim"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1,
                selector=client.V1LabelSelector(match_labels={"sim.gpuefficiency.io/workload": "victim"}),
            ),
        )
        client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(ns, pdb)
        bg.run.sim.add_faults([Fault(FaultKind.XID, at=25.0, node=NODE, gpu=gpu, value=48)])  # type: ignore[union-attr]

        # 2. One DeviceTaintRule, for exactly that device, NoSchedule first (the drain); the node
        # itself stays untainted.
        rules = wait_for(lambda: our_rules(custom), 60, what="our DeviceTaintRule")
        quarantined = bg.elapsed()
        assert len(rules) == 1, rules
        spec = rules[0]["spec"]
        assert spec["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE, "device": f"gpu-{gpu}"}
        assert (spec["taint"]["key"], spec["taint"]["value"], spec["taint"]["effect"]) == (
            "gpuefficiency.io/gpu-fault",
            "xid",
            "NoSchedule",
        )
        assert not [
            t for t in core.read_node(NODE).spec.taints or [] if t.key == "gpuefficiency.io/gpu-fault"
        ]

        # 3. The drain: the victim's eviction is refused by its PodDisruptionBudget (an EvictionBlocked
        # event, retried), so it stays until drainTimeout (20s); then the rule becomes NoExecute and
        # the controller-manager removes the victim. The pods on healthy GPUs are never touched.
        def rule_effect() -> str:
            found = our_rules(custom)
            return str(found[0]["spec"]["taint"]["effect"]) if found else ""

        def victim_events(reason: str) -> list[Any]:
            return [
                e
                for e in core.list_namespaced_event(ns).items
                if e.involved_object.name == "victim" and e.reason == reason
            ]

        blocked = wait_for(lambda: victim_events("EvictionBlocked"), 30, what="the drain's eviction refused")
        assert "retried next cycle until the drain timeout" in blocked[0].message
        assert rule_effect() == "NoSchedule"
        assert core.read_namespaced_pod("victim", ns).metadata.uid == uids["victim"]
        wait_for(
            lambda: rule_effect() == "NoExecute", 45, what="the rule upgraded to NoExecute after the drain"
        )
        upgraded = bg.elapsed()
        assert upgraded - quarantined >= 20, (quarantined, upgraded)

        def victim_gone() -> bool:
            live = {
                p.metadata.name: p.metadata.uid
                for p in core.list_namespaced_pod(ns).items
                if not p.metadata.deletion_timestamp
            }
            return "victim" not in live

        wait_for(victim_gone, 30, what="the pod on the faulty GPU removed by the NoExecute rule")
        live = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(ns).items}
        assert (live.get("filler"), live.get("bystander")) == (uids["filler"], uids["bystander"])
        for name in ("filler", "bystander"):
            assert not [
                e for e in core.list_namespaced_event(ns).items
                if e.involved_object.name == name and e.reason in ("EvictionBlocked", "GPUFaultEvicted")
            ], name  # fmt: skip

        # 4. A new 4-GPU claim schedules on the node's healthy GPUs, never on the tainted one.
        scenario = bg.run.name
        big_claim_pod(custom, core, ns, scenario)
        got = wait_for(
            lambda: pod_devices(custom, core, ns).get("newcomer"), 45, what="the 4-GPU claim allocated"
        )
        assert len(got) == 4
        assert gpu not in got
        assert not set(got) & {*devices["filler"], *devices["bystander"]}
        assert core.read_namespaced_pod("newcomer", ns).spec.node_name == NODE

        # 5. Recovery by hand removes the rule.
        core.patch_node(NODE, {"metadata": {"annotations": {"gpuefficiency.io/fault-recovered": "xid"}}})
        wait_for(lambda: not our_rules(custom), 30, what="the DeviceTaintRule removed on recovery")
        print(
            f"XID 48 at t=25s on GPU {gpu}: DeviceTaintRule (NoSchedule) by t={quarantined:.1f}s, "
            f"NoExecute after the blocked drain by t={upgraded:.1f}s"
        )
        time.sleep(0)
    result = bg.finish()
    assert result.passed, bg.report()
    # 6. The slices and our rules come from watches: with a DRA GPU (and later our rule) in the
    # cluster, steady cycles make no API read (DraReader LISTed our rules every cycle).
    assert result.operator_log is not None
    reads = [int(n) for n in READS.findall(result.operator_log.read_text(errors="replace"))]
    print("API reads per cycle:", reads)
    assert reads.count(0) >= 3, reads
