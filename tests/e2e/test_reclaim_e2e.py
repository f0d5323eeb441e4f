"""Owner-aware reclamation on the real local cluster (issue 17): each idle owner gets its action,
the freed GPUs run a pod that was waiting for them, and `gpu-efficiency restore` brings an owner back.

The scenario file ``procedural/owner-reclaim.yaml`` sets the stage and checks the owners' fields and
events; this test adds the HorizontalPodAutoscaler, the waiting 2-GPU pod and the restore command,
and prints the time from the reclaim to the waiting pod running (for the issue's note).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpu_efficiency.api import names
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

SCENARIO_LABEL = "sim.gpuefficiency.io/scenario"


def waiting_pod(name: str, scenario: str) -> dict[str, Any]:
    """A 2-GPU pod for the scenario's nodes: both are full, so it waits until GPUs are reclaimed."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {SCENARIO_LABEL: scenario},
            "tolerations": [
                {"key": SCENARIO_LABEL, "operator": "Equal", "value": scenario, "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }


def hpa(name: str, target: str) -> dict[str, Any]:
    """An HPA holding its Deployment at one replica (min = max), so only its presence matters."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": 1,
            "maxReplicas": 1,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def _stamp(value: datetime | None) -> float:
    assert value is not None
    return value.timestamp()


def test_idle_owners_get_their_action_and_the_freed_gpus_run_the_waiting_pod(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    batch = client.BatchV1Api(k8s)
    seen: dict[str, Any] = {}

    with BackgroundScenario("owner-reclaim", cluster, operator_identity, tmp_path) as bg:
        owners_ns, held_ns = bg.namespace("sim-owners"), bg.namespace("sim-owners-held")
        client.AutoscalingV2Api(k8s).create_namespaced_horizontal_pod_autoscaler(
            held_ns, hpa("autoscaled", "autoscaled")
        )
        core.create_namespaced_pod(owners_ns, waiting_pod("waiting", bg.run.name))

        def waiting() -> client.V1Pod:
            try:
                return core.read_namespaced_pod("waiting", owners_ns)
            except client.exceptions.ApiException as exc:
                raise AssertionError(f"the waiting pod: HTTP {exc.status}\n{bg.report()}") from exc

        time.sleep(5)
        assert waiting().status.phase == "Pending", "the nodes should be full before any reclaim"

        running = wait_for(
            lambda: (p := waiting()).status.phase == "Running" and p,
            170,
            what="the waiting 2-GPU pod Running on reclaimed GPUs",
        )
        scheduled = next(c for c in running.status.conditions if c.type == "PodScheduled")
        seen["node"] = running.spec.node_name
        reclaims = [
            e
            for e in core.list_namespaced_event(
                owners_ns, field_selector=f"reason={names.EV_RECLAIMED}"
            ).items
            if e.involved_object.kind in ("Deployment", "StatefulSet", "Job")
        ]
        assert reclaims, "no GPUReclaimed event on an owner"
        before = [
            _stamp(e.first_timestamp or e.event_time or e.metadata.creation_timestamp) for e in reclaims
        ]
        seen["reclaim_to_scheduled_s"] = _stamp(scheduled.last_transition_time) - max(
            t for t in before if t <= _stamp(scheduled.last_transition_time) + 1
        )

        # The notebook stays at zero: no replacement pod came back for its GPU.
        notebook = apps.read_namespaced_deployment("notebook", owners_ns)
        assert notebook.spec.replicas == 0
        annotations = notebook.metadata.annotations or {}
        assert annotations.get(names.PREVIOUS_REPLICAS) == "1", annotations
        # The Job is suspended, not failed.
        job = batch.read_namespaced_job("batch", owners_ns)
        assert job.spec.suspend is True
        assert not [c for c in job.status.conditions or [] if c.type == "Failed" and c.status == "True"]

        # One way back: the restore command, with the admin's rights.
        restored = cli(cluster, "restore", "deployment/notebook", "-n", owners_ns)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        notebook = apps.read_namespaced_deployment("notebook", owners_ns)
        assert notebook.spec.replicas == 1
        assert not set(notebook.metadata.annotations or {}) & set(names.OWNER_ANNOTATIONS)
        assert core.list_namespaced_event(
            owners_ns,
            field_selector=f"reason={names.EV_RESTORED},involvedObject.kind=Deployment,involvedObject.name=notebook",
        ).items, "no GPURestored event on the Deployment"
        # Nothing to restore on the busy Deployment: a clear error, and nothing changes.
        nothing = cli(cluster, "restore", "deployment/busy", "-n", owners_ns)
        assert nothing.returncode != 0
        assert "nothing to restore" in (nothing.stdout + nothing.stderr).lower(), nothing.stderr
        assert apps.read_namespaced_deployment("busy", owners_ns).spec.replicas == 1
    result = bg.finish()
    print(f"\nwaiting pod on {seen['node']}: reclaim → scheduled {seen['reclaim_to_scheduled_s']:.1f}s")
    assert result.passed, bg.report()
