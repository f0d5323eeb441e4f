"""Kubernetes objects for a scenario: fake GPU nodes, namespaces, workloads, PDBs and policies.

Pure functions returning plain dicts (what ``kubectl apply`` would send), so they are unit-tested
without a cluster. Every object carries the scenario and run labels: cleanup finds everything by
label, and a scenario's pods are pinned to its own nodes by a node selector.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Mapping
from typing import Any, Final

from gpu_efficiency.api.names import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpu_efficiency.api.policy import GROUP, KIND, VERSION
from gpu_efficiency_sim.allocation import DRA_DEVICE_PREFIX, DRA_DRIVER
from gpu_efficiency_sim.gpu_models import GPUModel, find_model
from gpu_efficiency_sim.scenario import NodeSpec, PDBSpec, WorkloadKind, WorkloadSpec
from gpu_efficiency_sim.simulator import SLICES_LABEL, WORKLOAD_LABEL

MANAGED_BY_KEY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "gpu-efficiency-sim"
SCENARIO_LABEL: Final = "sim.gpuefficiency.io/scenario"
RUN_LABEL: Final = "sim.gpuefficiency.io/run"
KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"
CONTAINER_NAME: Final = "main"


def ownership(scenario: str, run_id: str) -> dict[str, str]:
    return {MANAGED_BY_KEY: MANAGED_BY, SCENARIO_LABEL: scenario, RUN_LABEL: run_id}


def isolation_taint(scenario: str) -> dict[str, str]:
    """Keeps other tests' pods off a scenario's nodes; the scenario's own pods tolerate it."""
    return {"key": SCENARIO_LABEL, "value": scenario, "effect": "NoSchedule"}


def gpu_node(
    name: str,
    model: GPUModel,
    gpus: int,
    *,
    labels: Mapping[str, str],
    extended_gpus: int | None,
    taints: list[dict[str, Any]],
) -> dict[str, Any]:
    """A KWOK-managed node with GPU feature discovery's labels: the shape every fake GPU node shares.

    ``extended_gpus`` is the nvidia.com/gpu capacity (None: a DRA node, whose driver publishes
    ResourceSlices instead); ``labels`` come after GPU feature discovery's.
    """
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    if extended_gpus is not None:
        resources[GPU_RESOURCE] = str(extended_gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                GPU_PRODUCT_LABEL: model.product,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": str(model.fb_total_mib),
                "nvidia.com/gpu.family": model.family,
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def node(name: str, spec: NodeSpec, scenario: str, run_id: str, *, isolate: bool = True) -> dict[str, Any]:
    """A scenario's node: its labels and taints, owned by the run, tainted off other tests' pods."""
    taints = [t.model_dump() for t in spec.taints] + ([isolation_taint(scenario)] if isolate else [])
    return gpu_node(
        name,
        spec.gpu_model,
        spec.gpus,
        labels={SLICES_LABEL: str(spec.time_slicing), **ownership(scenario, run_id), **spec.labels},
        extended_gpus=None if spec.dra else spec.gpus * spec.time_slicing,
        taints=taints,
    )


def node_ip(name: str) -> str:
    """A stable, (almost surely) unique InternalIP per node name in 10.128.0.0/9, so pods' hostIP
    differs per node (KWOK's default would give every node 10.0.0.1)."""
    h = zlib.crc32(name.encode())
    return f"10.{128 + h % 128}.{h // 128 % 256}.{h // 32768 % 254 + 1}"


def cluster_nodes(prefix: str, first: int, count: int, models: list[str], gpus: int) -> list[dict[str, Any]]:
    """The local cluster's own GPU nodes (``cluster.sh up``/``add-nodes``): ``prefix``N for N from
    ``first``, models round-robin by N, no taints (any test workload schedules), and an InternalIP.

    Unknown models raise ValueError naming the known ones.
    """
    catalogue = [find_model(m) for m in models]
    if not catalogue:
        raise ValueError("give at least one GPU model")
    nodes = []
    for index in range(first, first + count):
        name = f"{prefix}{index}"
        obj = gpu_node(
            name, catalogue[index % len(catalogue)], gpus, labels={}, extended_gpus=gpus, taints=[]
        )
        obj["status"]["addresses"] = [
            {"type": "InternalIP", "address": node_ip(name)},
            {"type": "Hostname", "address": name},
        ]
        nodes.append(obj)
    return nodes


def device_class() -> dict[str, Any]:
    """The DeviceClass of the simulated DRA driver's GPUs (shared by every run, never deleted)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DRIVER, "labels": {MANAGED_BY_KEY: MANAGED_BY}},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
    }


def resource_slice(
    node_name: str, node_uid: str, uuids: list[str], model: str, scenario: str, run_id: str
) -> dict[str, Any]:
    """The node's GPUs as NVIDIA's DRA driver publishes them: pool = node, device gpu-<index>.

    Owned by the node, so the garbage collector removes it with the node.
    """
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node_name}-{DRA_DRIVER}-{run_id}".lower()[:253],
            "labels": ownership(scenario, run_id),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}],
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"{DRA_DEVICE_PREFIX}{i}",
                    "attributes": {
                        "uuid": {"string": uuid},
                        "index": {"int": i},
                        "productName": {"string": model},
                    },
                }
                for i, uuid in enumerate(uuids)
            ],
        },
    }


def claim_template(w: WorkloadSpec, namespace_name: str, scenario: str, run_id: str) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for the workload's GPUs, one claim per pod."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"{w.name}-gpus",
            "namespace": namespace_name,
            "labels": ownership(scenario, run_id),
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": DRA_DRIVER,
                                "allocationMode": "ExactCount",
                                "count": w.gpus,
                            },
                        }
                    ]
                }
            }
        },
    }


def namespace(
    name: str, scenario: str, run_id: str, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {**ownership(scenario, run_id), **labels},
            "annotations": dict(annotations),
        },
    }


def _pod_template(w: WorkloadSpec, scenario: str, run_id: str, restart_policy: str) -> dict[str, Any]:
    selector = {SCENARIO_LABEL: scenario, **w.node_selector}
    if w.node is not None:
        selector["kubernetes.io/hostname"] = w.node
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {}}
    if w.gpus and w.dra:
        resources["claims"] = [{"name": "gpus"}]
    elif w.gpus:
        resources["requests"][GPU_RESOURCE] = str(w.gpus)
        resources["limits"][GPU_RESOURCE] = str(w.gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": CONTAINER_NAME, "image": w.image, "resources": resources}],
        "nodeSelector": selector,
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,
    }
    if w.gpus and w.dra:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"{w.name}-gpus"}]
    isolation = {**isolation_taint(scenario), "operator": "Equal"}
    spec["tolerations"] = [isolation, *copy.deepcopy(w.tolerations)]
    if w.priority_class_name:
        spec["priorityClassName"] = w.priority_class_name
    if w.termination_grace_period_seconds is not None:
        spec["terminationGracePeriodSeconds"] = w.termination_grace_period_seconds
    return {
        "metadata": {
            "labels": {**ownership(scenario, run_id), WORKLOAD_LABEL: w.name, **w.labels},
            "annotations": dict(w.annotations),
        },
        "spec": spec,
    }


def workload(w: WorkloadSpec, namespace_name: str, scenario: str, run_id: str) -> dict[str, Any]:
    """The workload object: a bare Pod, or a controller with the workload label as its selector."""
    meta = {"name": w.name, "namespace": namespace_name, "labels": ownership(scenario, run_id)}
    selector = {"matchLabels": {WORKLOAD_LABEL: w.name}}
    if w.kind is WorkloadKind.POD:
        template = _pod_template(w, scenario, run_id, "Always")
        pod_meta = {
            **meta,
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
    if w.kind is WorkloadKind.DEPLOYMENT:
        spec: dict[str, Any] = {
            "replicas": w.replicas,
            "selector": selector,
            "template": _pod_template(w, scenario, run_id, "Always"),
        }
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}
    if w.kind is WorkloadKind.STATEFUL_SET:
        spec = {
            "replicas": w.replicas,
            "serviceName": w.name,
            "selector": selector,
            "podManagementPolicy": "Parallel",
            "template": _pod_template(w, scenario, run_id, "Always"),
        }
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec}
    spec = {
        "parallelism": w.replicas,
        "completions": w.replicas,
        "backoffLimit": 100,
        "template": _pod_template(w, scenario, run_id, "Never"),
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def pdb(w: WorkloadSpec, spec: PDBSpec, namespace_name: str, scenario: str, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {"selector": {"matchLabels": {WORKLOAD_LABEL: w.name}}}
    if spec.min_available is not None:
        body["minAvailable"] = spec.min_available
    else:
        body["maxUnavailable"] = spec.max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": w.name, "namespace": namespace_name, "labels": ownership(scenario, run_id)},
        "spec": body,
    }


def _empty_selector(selector: Any) -> bool:
    return not selector or (not selector.get("matchLabels") and not selector.get("matchExpressions"))


def policy(
    name: str,
    spec: Mapping[str, Any],
    scenario: str,
    run_id: str,
    *,
    scope: bool,
    namespace_prefix: str = "",
    scenario_namespaces: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A GPUEfficiencyPolicy; with ``scope``, empty namespace/node selectors select this scenario only.

    Scenario namespace names in selection.excludedNamespaces get the namespace prefix too.
    """
    body = copy.deepcopy(dict(spec))
    selection = body.setdefault("selection", {})
    if scope:
        for field in ("namespaceSelector", "nodeSelector"):
            if _empty_selector(selection.get(field)):
                selection[field] = {"matchLabels": {SCENARIO_LABEL: scenario}}
    excluded = selection.get("excludedNamespaces")
    if excluded and namespace_prefix:
        selection["excludedNamespaces"] = [
            namespace_prefix + ns if ns in scenario_namespaces else ns for ns in excluded
        ]
    if not selection:
        del body["selection"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": ownership(scenario, run_id)},
        "spec": body,
    }
