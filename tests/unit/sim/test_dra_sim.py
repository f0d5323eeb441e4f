"""The simulator's DRA side: nodes publish ResourceSlices, claim pods hold the devices allocated."""

from __future__ import annotations

from typing import Any

from gpu_efficiency.objects.dra import parse_slices
from gpu_efficiency.sources.kube.cluster import pod_view
from gpu_efficiency_sim import manifests
from gpu_efficiency_sim.allocation import GPUAllocator, PodInfo, claim_devices, pod_from_json
from gpu_efficiency_sim.scenario import parse_scenario

SCENARIO = parse_scenario(
    """
name: dra
nodes:
  - {name: dra-a, gpus: 4, dra: true}
workloads:
  - {name: train, namespace: team, kind: Pod, gpus: 2, dra: true, node: dra-a}
"""
).scenario
NODE, WORKLOAD = SCENARIO.nodes[0], SCENARIO.workloads[0]


def claim_pod(uid: str = "u1", node: str = "dra-a") -> dict[str, Any]:
    template = manifests.workload(WORKLOAD, "team", "dra", "r1")
    return {
        "metadata": {**template["metadata"], "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {**template["spec"], "nodeName": node},
        "status": {"phase": "Running"},
    }


def claim(uid: str, *devices: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {"results": [{"driver": driver, "pool": "dra-a", "device": d} for d in devices]}
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": uid}],
        }
    }


def test_a_dra_node_has_no_gpu_capacity_and_its_slice_lists_every_gpu_with_its_uuid() -> None:
    node = manifests.node("dra-a", NODE, "dra", "r1")
    assert "nvidia.com/gpu" not in node["status"]["capacity"]
    body = manifests.resource_slice("dra-a", "uid-1", [f"GPU-{i}" for i in range(4)], "H100", "dra", "r1")
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    devices = parse_slices([body])  # as the operator reads it
    assert [(d.device, d.uuid, d.pool) for d in devices] == [
        (f"gpu-{i}", f"GPU-{i}", "dra-a") for i in range(4)
    ]


def test_a_claim_workload_asks_through_its_template_not_the_extended_resource() -> None:
    pod = manifests.workload(WORKLOAD, "team", "dra", "r1")
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["resources"]["claims"] == [{"name": "gpus"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "train-gpus"}]
    template = manifests.claim_template(WORKLOAD, "team", "dra", "r1")
    assert template["metadata"]["name"] == "train-gpus"
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2


def test_claim_devices_maps_reserving_pods_to_the_simulated_drivers_gpu_indexes() -> None:
    devices = claim_devices([claim("u1", "gpu-3", "gpu-1"), claim("u2", "nic-0", driver="net.example.com")])
    assert devices == {"u1": (1, 3), "u2": ()}


def test_a_claim_pod_holds_exactly_its_allocated_devices() -> None:
    info = pod_from_json(claim_pod())
    assert info is not None
    assert info.dra
    assert not info.active, "no allocation yet: no GPU"
    plugin = PodInfo("team", "old", "u0", "dra-a", "2025-01-01T00:00:00Z", (("main", 1),))
    held = GPUAllocator().update({"dra-a": 4}, [plugin, PodInfo(**{**_fields(info), "devices": (0, 3)})])
    assert {k: h.pod.name for k, h in held.items()} == {
        ("dra-a", 0): "train",
        ("dra-a", 3): "train",
        ("dra-a", 1): "old",
    }


def test_the_operator_counts_a_claim_pod_as_a_gpu_pod() -> None:
    assert pod_view(claim_pod()).gpu_request == 1
    plain = claim_pod()
    plain["spec"] = {**plain["spec"], "resourceClaims": [], "containers": [{"name": "main"}]}
    assert pod_view(plain).gpu_request == 0


def _fields(info: PodInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in PodInfo.__dataclass_fields__}
