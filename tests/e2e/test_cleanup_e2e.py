"""``gpu-efficiency cleanup`` on the real local cluster, run as the kubectl plugin through the
cluster's own kubectl: after an uninstall it removes our node taint, node conditions, DeviceTaintRule
and ``gpuefficiency.io/`` annotations and leaves everyone else's; an owner still reclaimed keeps its
record and is listed with its restore command; --dry-run changes nothing; it refuses while an
operator holds its Lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from tests.e2e.harness import Cluster

pytestmark = pytest.mark.e2e

RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")
OURS = {"app.kubernetes.io/managed-by": "gpu-efficiency-operator"}
FOREIGN_TAINT = {"key": "example.com/dedicated", "value": "ml", "effect": "NoSchedule"}
FOREIGN_CONDITION = "ExampleHealthy"
NOWHERE = {"example.com/no-such-node": "true"}  # pods of the test's workloads stay Pending


def _plugin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl gpu-efficiency ARGS`` with the cluster's kubectl, finding our plugin on the PATH."""
    bin_dir = str(Path(sys.executable).parent)  # where pip put kubectl-gpu_efficiency
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [cluster.kubectl, "gpu-efficiency", *args], capture_output=True, text=True, env=env, timeout=120
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _node(core: client.CoreV1Api, name: str) -> Any:
    return core.read_node(name)


def _ours_on(obj_annotations: dict[str, str] | None) -> list[str]:
    return [k for k in (obj_annotations or {}) if k.startswith("gpuefficiency.io/")]


def test_cleanup_removes_only_what_the_operator_wrote(
    cluster: Cluster, k8s: client.ApiClient, namespace: str
) -> None:
    core, apps, batch = client.CoreV1Api(k8s), client.AppsV1Api(k8s), client.BatchV1Api(k8s)
    custom, coordination = client.CustomObjectsApi(k8s), client.CoordinationV1Api(k8s)
    suffix = uuid.uuid4().hex[:6]
    node = f"cleanup-gpu-{suffix}"
    core.create_node(
        {
            "metadata": {
                "name": node,
                "annotations": {names.NODE_FAULTS: "{}", names.XID_HISTORY: "{}", "example.com/keep": "x"},
            },
            "spec": {
                "taints": [
                    FOREIGN_TAINT,
                    {"key": names.FAULT_TAINT_KEY, "value": "xid", "effect": "NoSchedule"},
                ]
            },
        }
    )
    try:
        conditions = [
            {"type": t, "status": s, "reason": "Test", "message": "e2e", "lastTransitionTime": _now()}
            for t, s in (
                (names.GPU_HEALTHY, "False"),
                (names.GPU_DEGRADED, "True"),
                (FOREIGN_CONDITION, "True"),
            )
        ]
        core.patch_node_status(node, {"status": {"conditions": conditions}})
        pending = {"nodeSelector": NOWHERE, "containers": [{"name": "c", "image": "busybox"}]}
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "nb-0", "annotations": {names.STATE: "Idle", "example.com/a": "1"}},
                "spec": pending,
            },
        )

        def deployment(name: str, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
            labels = {"app": name}
            return {
                "metadata": {"name": name, "annotations": annotations},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": pending},
                },
            }

        record = {
            names.RECLAIMED: "ScaleToZero",
            names.PREVIOUS_REPLICAS: "1",
            names.RECLAIMED_AT: _now(),
            names.RECLAIMED_BY: "e2e",
        }
        apps.create_namespaced_deployment(
            namespace, deployment("reclaimed", 0, {**record, "example.com/a": "1"})
        )
        apps.create_namespaced_deployment(namespace, deployment("scaled-back", 1, record))  # by hand
        batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": "train", "annotations": {names.RECLAIMED: "Suspend"}},
                "spec": {
                    "suspend": True,
                    "template": {"spec": {**pending, "restartPolicy": "Never"}},
                },
            },
        )
        rule = f"gpuefficiency-xid-{suffix}"
        rules_served = True
        try:
            custom.create_cluster_custom_object(
                *RULES,
                {
                    "apiVersion": "resource.k8s.io/v1beta2",
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": rule, "labels": OURS},
                    "spec": {
                        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
                        "taint": {"key": names.FAULT_TAINT_KEY, "value": "xid", "effect": "NoSchedule"},
                    },
                },
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            rules_served = False  # a cluster without DRA device taints: cleanup must say so, not fail

        # the plugin, through the cluster's kubectl: keep sets our annotation (-n, kubectl style)
        kept = _plugin(cluster, "keep", "nb-0", "4h", "-n", namespace)
        assert kept.returncode == 0, kept.stderr
        assert core.read_namespaced_pod("nb-0", namespace).metadata.annotations[names.KEEP_FOR] == "4h"

        # an operator holding its Lease: refused, nothing changed
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name="gpu-efficiency-operator"),
            spec=client.V1LeaseSpec(
                holder_identity="e2e-op", lease_duration_seconds=15, renew_time=datetime.now(UTC)
            ),
        )
        coordination.create_namespaced_lease(namespace, lease)
        refused = _plugin(cluster, "cleanup")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.startswith(
            "kubectl gpu-efficiency cleanup: error: the operator is still running"
        )
        assert f"Lease {namespace}/gpu-efficiency-operator is held by e2e-op" in refused.stderr
        beside = _plugin(cluster, "cleanup", "--dry-run", "-o", "json")  # writes nothing: allowed
        assert beside.returncode == 0, beside.stderr
        assert f"gpu-efficiency restore deployment/reclaimed -n {namespace}" in beside.stdout
        coordination.delete_namespaced_lease("gpu-efficiency-operator", namespace)

        # --force: another test's operator may have been killed without releasing its Lease
        dry = _plugin(cluster, "cleanup", "--dry-run", "--force", "-o", "json")
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)
        mine = {
            c["object"]: c for c in planned["changes"] if suffix in c["object"] or namespace in c["object"]
        }
        assert {c["result"] for c in mine.values()} == {"would"}
        assert _ours_on(_node(core, node).metadata.annotations)  # nothing changed
        assert any(t.key == names.FAULT_TAINT_KEY for t in _node(core, node).spec.taints)

        done = _plugin(cluster, "cleanup", "--force", "-o", "yaml")
        assert done.returncode == 0, done.stdout + done.stderr
        after = _node(core, node)
        assert _ours_on(after.metadata.annotations) == []
        assert after.metadata.annotations["example.com/keep"] == "x"
        taints = [(t.key, t.value, t.effect) for t in after.spec.taints or []]
        assert (FOREIGN_TAINT["key"], FOREIGN_TAINT["value"], FOREIGN_TAINT["effect"]) in taints
        assert not any(key == names.FAULT_TAINT_KEY for key, _, _ in taints)
        types = {c.type for c in core.read_node_status(node).status.conditions or []}
        assert FOREIGN_CONDITION in types
        assert not types & {names.GPU_HEALTHY, names.GPU_DEGRADED}
        pod = core.read_namespaced_pod("nb-0", namespace).metadata.annotations
        assert _ours_on(pod) == []
        assert pod["example.com/a"] == "1"
        reclaimed = apps.read_namespaced_deployment("reclaimed", namespace)
        assert reclaimed.metadata.annotations[names.RECLAIMED] == "ScaleToZero"  # the way back stays
        assert _ours_on(apps.read_namespaced_deployment("scaled-back", namespace).metadata.annotations) == []
        assert (
            batch.read_namespaced_job("train", namespace).metadata.annotations[names.RECLAIMED] == "Suspend"
        )
        restores = {
            o["restore"]
            for o in json.loads(_plugin(cluster, "cleanup", "--dry-run", "--force", "-o", "json").stdout)[
                "reclaimedOwners"
            ]
        }
        assert f"gpu-efficiency restore deployment/reclaimed -n {namespace}" in restores
        assert f"gpu-efficiency restore job/train -n {namespace}" in restores
        assert f"gpu-efficiency restore deployment/scaled-back -n {namespace}" not in restores
        if rules_served:
            with pytest.raises(ApiException) as gone:
                custom.get_cluster_custom_object(*RULES, rule)
            assert gone.value.status == 404
        else:
            assert "DeviceTaintRules" in done.stdout
    finally:
        core.delete_node(node)
