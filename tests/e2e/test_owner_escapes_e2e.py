"""Owners that used to keep an idle GPU for ever, on the real local cluster (issue 32): an HPA's
target, a standalone ReplicaSet, a CronJob's Job and a pod whose controller is a ConfigMap are each
reclaimed once; the ConfigMap's pod coming back idle is ReclaimIneffective (not evicted in a loop)
and a scale put back by a GitOps tool (this test plays it) is ReclaimReverted (not scaled again
during its back-off). The control plane runs the real kube-controller-manager, so the HPA's
ScalingDisabled and its return after ``gpu-efficiency restore`` come from the real HPA controller.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency_sim.simulator import PROFILE_ANNOTATION, WORKLOAD_LABEL
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario
from tests.e2e.test_reclaim_e2e import event_count, waiting_pod
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

POLICY = "owner-escapes"
T = TypeVar("T")


def idle_pod_spec(scenario: str, node: str) -> dict[str, Any]:
    """The spec of a 1-GPU pod on the scenario's node (the simulator plays it by its annotation)."""
    spec: dict[str, Any] = waiting_pod("x", scenario, node)["spec"]
    spec["containers"][0]["resources"] = {"limits": {names.GPU_RESOURCE: "1"}}
    return spec


def template(app: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}, "annotations": {PROFILE_ANNOTATION: "idle"}},
        "spec": copy.deepcopy(spec) | extra,
    }


def controller_ref(obj: Any, api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": True,
    }


def hpa_on(target: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": target},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": 1,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def test_escapes_are_reclaimed_once_and_comebacks_and_reverts_are_not_fought(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    batch = client.BatchV1Api(k8s)
    hpas = client.AutoscalingV2Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    seen: dict[str, float] = {}

    with BackgroundScenario("owner-escapes", cluster, operator_identity, tmp_path) as bg:
        ns = bg.namespace("sim-escapes")
        spec = idle_pod_spec(bg.run.name, bg.run.names.nodes["escape-gpu-0"])

        def until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
            try:
                return wait_for(probe, timeout, interval=0.5, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{bg.report()}") from None

        def status() -> dict[str, Any]:
            obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, POLICY)
            return dict(obj.get("status") or {})

        def live(pod_name: str) -> client.V1Pod | None:
            try:
                found = core.read_namespaced_pod(pod_name, ns)
            except client.exceptions.ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return None if found.metadata.deletion_timestamp else found

        hpas.create_namespaced_horizontal_pod_autoscaler(ns, hpa_on("autoscaled"))
        apps.create_namespaced_replica_set(
            ns,
            {
                "metadata": {"name": "solo"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "solo"}},
                    "template": template("solo", spec),
                },
            },
        )
        cron = batch.create_namespaced_cron_job(
            ns,
            {
                "metadata": {"name": "nightly"},
                "spec": {
                    "schedule": "0 0 1 1 *",
                    "jobTemplate": {"spec": {"template": template("nightly", spec, restartPolicy="Never")}},
                },
            },
        )
        # What the CronJob controller does at a scheduled time: a Job it controls.
        batch.create_namespaced_job(
            ns,
            {
                "metadata": {
                    "name": "nightly-1",
                    "ownerReferences": [controller_ref(cron, "batch/v1", "CronJob")],
                },
                "spec": {"template": template("nightly", spec, restartPolicy="Never")},
            },
        )
        holder = core.create_namespaced_config_map(ns, {"metadata": {"name": "holder"}})

        def stray(name: str) -> dict[str, Any]:
            pod = template("stray", spec)
            pod["metadata"] |= {"name": name, "ownerReferences": [controller_ref(holder, "v1", "ConfigMap")]}
            return pod

        core.create_namespaced_pod(ns, stray("stray-1"))

        # (4) The ConfigMap's pod is evicted; a replacement of the same owner comes (checked below).
        until(lambda: live("stray-1") is None, 60, "stray-1 evicted")
        core.create_namespaced_pod(ns, stray("stray-2"))
        # (5) A GitOps tool puts `reverted` back at 2 replicas without restore (checked below).
        until(lambda: apps.read_namespaced_deployment("reverted", ns).spec.replicas == 0, 60, "reverted at 0")
        apps.patch_namespaced_deployment_scale("reverted", ns, {"spec": {"replicas": 2}})
        seen["reverted_at"] = time.time()
        # (1) The HPA's target is scaled to zero; the real HPA controller stops (ScalingDisabled).
        until(
            lambda: apps.read_namespaced_deployment("autoscaled", ns).spec.replicas == 0,
            120,
            "autoscaled at 0",
        )
        record = apps.read_namespaced_deployment("autoscaled", ns).metadata.annotations or {}
        assert record.get(names.RECLAIMED_AUTOSCALER) == "horizontalpodautoscaler/autoscaled", record

        def scaling_active() -> client.V2HorizontalPodAutoscalerCondition | None:
            conditions = hpas.read_namespaced_horizontal_pod_autoscaler("autoscaled", ns).status.conditions
            return next((c for c in conditions or [] if c.type == "ScalingActive"), None)

        disabled = until(
            lambda: (c := scaling_active()) is not None and c.reason == "ScalingDisabled" and c,
            60,
            "the HPA's ScalingActive=False ScalingDisabled",
        )
        assert disabled.status == "False"
        restored = cli(cluster, "restore", "deployment/autoscaled", "-n", ns)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert "horizontalpodautoscaler/autoscaled takes over scaling again" in restored.stdout
        assert apps.read_namespaced_deployment("autoscaled", ns).spec.replicas == 1
        # the HPA reconciles the target again (no metrics server here: its next reason is a metrics one)
        until(
            lambda: (c := scaling_active()) is not None and c.reason != "ScalingDisabled",
            60,
            "the HPA active again after restore",
        )

        # (2) The standalone ReplicaSet is scaled through replicasets/scale, the way back on it.
        until(
            lambda: apps.read_namespaced_replica_set("solo", ns).spec.replicas == 0, 60, "the ReplicaSet at 0"
        )
        solo = apps.read_namespaced_replica_set("solo", ns).metadata.annotations or {}
        assert solo.get(names.PREVIOUS_REPLICAS) == "1", solo

        # (3) The CronJob's Job is suspended, not the CronJob; the event says the next run starts.
        until(
            lambda: batch.read_namespaced_job("nightly-1", ns).spec.suspend is True, 60, "the Job suspended"
        )
        assert not batch.read_namespaced_cron_job("nightly", ns).spec.suspend
        (reclaimed,) = core.list_namespaced_event(
            ns,
            field_selector=f"reason={names.EV_RECLAIMED},involvedObject.kind=Job,involvedObject.name=nightly-1",
        ).items
        assert "cronjob/nightly is left alone: its next scheduled run will start" in reclaimed.message

        # (4) The replacement, idle again, is ReclaimIneffective: reported once, not evicted.
        until(
            lambda: event_count(core, ns, "Pod", "stray-2", names.EV_RECLAIM_INEFFECTIVE) > 0,
            90,
            "ReclaimIneffective on stray-2",
        )
        assert status().get("reclaimsIneffectiveTotal") == 1, status()
        for _ in range(3 * 5):  # three cycles: left alone, reported once
            assert live("stray-2") is not None, "the replacement was evicted again"
            time.sleep(1)
        assert event_count(core, ns, "Pod", "stray-2", names.EV_RECLAIM_INEFFECTIVE) == 1

        # (5) ReclaimReverted once, and no second scale while the back-off runs.
        until(
            lambda: event_count(core, ns, "Deployment", "reverted", names.EV_RECLAIM_REVERTED) > 0,
            90,
            "ReclaimReverted on the Deployment",
        )
        seen["reported_after_s"] = time.time() - seen["reverted_at"]
        (event,) = core.list_namespaced_event(
            ns,
            field_selector=f"reason={names.EV_RECLAIM_REVERTED},involvedObject.kind=Deployment,involvedObject.name=reverted",
        ).items
        assert "ignore spec.replicas differences" in event.message, event.message
        current = status()
        assert current.get("reclaimsRevertedTotal") == 1, current
        (hold,) = [h for h in current.get("ownerHolds") or [] if h["owner"] == f"{ns}/Deployment/reverted"]
        end = parse_rfc3339(hold["until"])
        assert end is not None
        while time.time() < end - 1:
            assert apps.read_namespaced_deployment("reverted", ns).spec.replicas == 2, (
                "scaled again in the back-off"
            )
            pods = core.list_namespaced_pod(ns, label_selector=f"{WORKLOAD_LABEL}=reverted").items
            current_pods = [p for p in pods if p.metadata.deletion_timestamp is None]
            assert not [p for p in current_pods if names.EVICT_AFTER in (p.metadata.annotations or {})], (
                "warned in the back-off"
            )
            time.sleep(1)
        assert event_count(core, ns, "Deployment", "reverted", names.EV_RECLAIMED) == 1
    result = bg.finish()
    print(f"\nReclaimReverted reported {seen['reported_after_s']:.0f}s after the revert")
    assert result.passed, bg.report()
