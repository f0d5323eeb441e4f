"""Owners from CRDs on the real local cluster (issue 32): a Job admitted by Kueue is reclaimed by
deactivating its Workload, never by suspending the Job behind Kueue's back, and a RayCluster is
suspended; `gpu-efficiency restore` brings both back.

Kueue's Workload CRD (kubernetes-sigs/kueue v0.19.2) and KubeRay's RayCluster CRD (ray-project/kuberay
v1.7.0) are installed unchanged from tests/e2e/crds/. Their managers are not run here (Kueue's needs
its webhooks, queues and flavours; neither is built by the local cluster), so the test plays their
part, as the Notebook test plays Kubeflow's, doing what their controllers do for these objects:

* Kueue (pkg/controller/jobframework/reconciler.go, pkg/controller/core/workload_controller.go): a
  Workload controlled by the Job, admitted (QuotaReserved, Admitted), then the Job unsuspended; a
  Workload with spec.active=false evicted (Evicted, reason Deactivated), its admission cleared and
  the Job suspended; reactivated, admitted again and the Job unsuspended.
* KubeRay (ray-operator/controllers/ray/raycluster_controller.go): head and worker pods controlled by
  the RayCluster; with spec.suspend=true all of them deleted and RayClusterSuspended set; resumed,
  the pods created again.

The real Job controller (kube-controller-manager) deletes the Job's pods when Kueue suspends it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency_sim.simulator import PROFILE_ANNOTATION
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario
from tests.e2e.test_reclaim_e2e import event_count, waiting_pod
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).parent / "crds"
KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")
RAY = ("ray.io", "v1", "rayclusters")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: How long the played Kueue waits before suspending a deactivated Workload's Job: longer than a
#: cycle, so a Job suspended meanwhile could only have been suspended by the operator.
KUEUE_LAG_S = 8.0


def install_vendored_crd(k8s: client.ApiClient, file: str) -> str:
    """Create a CRD from tests/e2e/crds/ (one already there is kept) and wait until Established.
    Created, not applied: these CRDs are larger than the 256 KiB a last-applied annotation may hold."""
    (crd,) = [d for d in yaml.safe_load_all((CRDS / file).read_text()) if d]
    ext = client.ApiextensionsV1Api(k8s)
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
    name: str = crd["metadata"]["name"]

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, 60, what=f"CRD {name} Established")
    return name


def gpu_pod_spec(scenario: str, node: str, gpus: int) -> dict[str, Any]:
    spec: dict[str, Any] = waiting_pod("x", scenario, node)["spec"]
    spec["containers"][0]["resources"] = {"limits": {names.GPU_RESOURCE: str(gpus)}} if gpus else {}
    spec["restartPolicy"] = "Never"
    return spec


def controlled_by(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def condition(kind: str, status: bool, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": f"played by the e2e test: {reason}",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class Player(threading.Thread):
    """A controller played by the test: ``step`` every half second until stopped; errors kept."""

    def __init__(self, name: str, step: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.step = step
        self.halt = threading.Event()
        self.errors: list[str] = []
        self.log: list[str] = []

    def run(self) -> None:
        while not self.halt.wait(0.5):
            try:
                self.step()
            except ApiException as exc:
                if exc.status not in (404, 409):  # gone, or changed meanwhile: next step sees it
                    self.errors.append(f"HTTP {exc.status}: {exc.body}")


class PlayedKueue:
    """Kueue's part for one Job: its Workload, admission, and eviction on deactivation."""

    def __init__(self, k8s: client.ApiClient, namespace: str, job: dict[str, Any], template: dict[str, Any]):
        self.custom = client.CustomObjectsApi(k8s)
        self.batch = client.BatchV1Api(k8s)
        self.ns = namespace
        self.job_name = job["metadata"]["name"]
        self.name = f"job-{self.job_name}-{job['metadata']['uid'][:5]}"
        self.deactivated_at: float | None = None
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": self.name,
                "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                "ownerReferences": [controlled_by(job, "batch/v1", "Job")],
            },
            "spec": {"queueName": "team-q", "podSets": [{"name": "main", "count": 1, "template": template}]},
        }
        self.custom.create_namespaced_custom_object(*KUEUE[:2], namespace, KUEUE[2], body)
        self.player = Player("played-kueue", self.step)

    def workload(self) -> dict[str, Any]:
        obj: Any = self.custom.get_namespaced_custom_object(*KUEUE[:2], self.ns, KUEUE[2], self.name)
        return dict(obj)

    def _status(self, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            *KUEUE[:2], self.ns, KUEUE[2], self.name, {"status": body}
        )

    def _suspend_job(self, suspend: bool) -> None:
        self.batch.patch_namespaced_job(self.job_name, self.ns, {"spec": {"suspend": suspend}})

    def step(self) -> None:
        wl = self.workload()
        active = (wl.get("spec") or {}).get("active", True)
        admitted = any(
            c["type"] == "Admitted" and c["status"] == "True"
            for c in (wl.get("status") or {}).get("conditions") or ()
        )
        if active and not admitted:
            self._status(
                {
                    "admission": {
                        "clusterQueue": "team-cq",
                        "podSetAssignments": [
                            {"name": "main", "count": 1, "flavors": {names.GPU_RESOURCE: "h100"}}
                        ],
                    },
                    "conditions": [
                        condition("QuotaReserved", True, "QuotaReserved"),
                        condition("Admitted", True, "Admitted"),
                        condition("Evicted", False, "Reactivated"),
                    ],
                }
            )
            self._suspend_job(False)
            self.deactivated_at = None
            self.player.log.append("admitted, job unsuspended")
        elif not active and admitted:
            if self.deactivated_at is None:
                self.deactivated_at = time.time()
            if time.time() - self.deactivated_at < KUEUE_LAG_S:
                return
            self._suspend_job(True)
            self._status(
                {
                    "admission": None,
                    "conditions": [
                        condition("QuotaReserved", False, "Pending"),
                        condition("Admitted", False, "NoReservation"),
                        condition("Evicted", True, "Deactivated"),
                    ],
                }
            )
            self.player.log.append("deactivated: evicted, job suspended")


class PlayedKubeRay:
    """KubeRay's part for one RayCluster: a head pod and one GPU worker, deleted while suspended."""

    def __init__(
        self, k8s: client.ApiClient, namespace: str, cluster: dict[str, Any], scenario: str, node: str
    ):
        self.custom = client.CustomObjectsApi(k8s)
        self.core = client.CoreV1Api(k8s)
        self.ns = namespace
        self.cluster = cluster
        self.name = cluster["metadata"]["name"]
        self.scenario, self.node = scenario, node
        self.player = Player("played-kuberay", self.step)

    def pods(self) -> list[client.V1Pod]:
        found = self.core.list_namespaced_pod(self.ns, label_selector=f"ray.io/cluster={self.name}").items
        return [p for p in found if p.metadata.deletion_timestamp is None]

    def _create_pods(self) -> None:
        for role, gpus in (("head", 0), ("worker", 1)):
            self.core.create_namespaced_pod(
                self.ns,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": f"{self.name}-{role}-",
                        "labels": {"ray.io/cluster": self.name, "ray.io/node-type": role},
                        "annotations": {PROFILE_ANNOTATION: "idle"},
                        "ownerReferences": [controlled_by(self.cluster, "ray.io/v1", "RayCluster")],
                    },
                    "spec": gpu_pod_spec(self.scenario, self.node, gpus),
                },
            )

    def step(self) -> None:
        obj: Any = self.custom.get_namespaced_custom_object(*RAY[:2], self.ns, RAY[2], self.name)
        suspend = (obj.get("spec") or {}).get("suspend") is True
        pods = self.pods()
        if suspend and pods:
            for pod in pods:
                self.core.delete_namespaced_pod(pod.metadata.name, self.ns, grace_period_seconds=0)
            status = {"conditions": [condition("RayClusterSuspended", True, "RayClusterSuspended")]}
            self.custom.patch_namespaced_custom_object_status(
                *RAY[:2], self.ns, RAY[2], self.name, {"status": status}
            )
            self.player.log.append("suspended: pods deleted")
        elif not suspend and not pods:
            self._create_pods()
            self.player.log.append("pods created")


def test_a_kueue_job_is_deactivated_through_its_workload_and_a_raycluster_suspended_then_both_restored(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    batch = client.BatchV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy = "crd-owners"
    # before the operator starts: its discovery finds both integrations
    install_vendored_crd(k8s, "kueue-v0.19.2-workloads.yaml")
    install_vendored_crd(k8s, "kuberay-v1.7.0-rayclusters.yaml")
    done = threading.Event()
    players: list[Player] = []

    with BackgroundScenario(
        policy, cluster, operator_identity, tmp_path, before_teardown=lambda: done.wait(400)
    ) as bg:
        try:
            ns = bg.namespace("sim-crd")
            node = bg.run.names.nodes["crd-gpu-0"]

            def until(probe: Callable[[], Any], timeout: float, what: str) -> Any:
                try:
                    return wait_for(probe, timeout, interval=0.5, what=what)
                except AssertionError as exc:
                    logs = {p.name: p.log + p.errors for p in players}
                    raise AssertionError(f"{exc}\nplayers: {logs}\n{bg.report()}") from None

            # A Job submitted to a Kueue queue: created suspended (Kueue's webhook does that), then
            # Kueue (played) creates its Workload, admits it and unsuspends the Job.
            template = {
                "metadata": {"annotations": {PROFILE_ANNOTATION: "idle"}},
                "spec": gpu_pod_spec(bg.run.name, node, 1),
            }
            job: Any = batch.create_namespaced_job(
                ns,
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "train", "labels": {QUEUE_LABEL: "team-q"}},
                    "spec": {"suspend": True, "backoffLimit": 0, "template": template},
                },
            )
            kueue = PlayedKueue(k8s, ns, k8s.sanitize_for_serialization(job), template)
            # A RayCluster, and KubeRay (played) creating its head and GPU worker pods.
            ray_spec = {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": gpu_pod_spec(bg.run.name, node, 0)},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {"spec": gpu_pod_spec(bg.run.name, node, 1)},
                    }
                ],
            }
            raycluster: Any = custom.create_namespaced_custom_object(
                *RAY[:2],
                ns,
                RAY[2],
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "metadata": {"name": "rc"},
                    "spec": ray_spec,
                },
            )
            kuberay = PlayedKubeRay(k8s, ns, dict(raycluster), bg.run.name, node)
            players.extend((kueue.player, kuberay.player))
            for p in players:
                p.start()

            def job_pods() -> list[client.V1Pod]:
                found = core.list_namespaced_pod(ns, label_selector="job-name=train").items
                return [p for p in found if p.metadata.deletion_timestamp is None]

            def running(pods: list[client.V1Pod]) -> bool:
                return bool(pods) and all(p.status.phase == "Running" for p in pods)

            until(lambda: running(job_pods()), 60, "the admitted Job's pod running")
            until(lambda: len(kuberay.pods()) == 2, 60, "the RayCluster's head and worker pods")

            # (1) The Workload is deactivated; the Job's suspend is left to Kueue.
            def workload() -> dict[str, Any]:
                return kueue.workload()

            until(lambda: workload()["spec"].get("active") is False, 150, "the Workload deactivated")
            deactivated = time.time()
            ann = workload()["metadata"].get("annotations") or {}
            assert ann.get(names.RECLAIMED) == "Deactivate", ann
            assert ann.get(names.RECLAIMED_BY) == policy, ann
            while time.time() < deactivated + KUEUE_LAG_S - 2:  # Kueue (played) has not acted yet
                train = batch.read_namespaced_job("train", ns)
                assert train.spec.suspend is False, "the Job was suspended behind Kueue's back"
                time.sleep(0.5)
            until(lambda: batch.read_namespaced_job("train", ns).spec.suspend, 30, "Kueue suspending the Job")
            until(lambda: not job_pods(), 60, "the Job's pod gone (GPU free)")
            train = batch.read_namespaced_job("train", ns)
            assert not {k for k in train.metadata.annotations or {} if k.startswith("gpuefficiency.io/")}

            # (2) The RayCluster is suspended; KubeRay (played) deletes its pods.
            def ray() -> dict[str, Any]:
                obj: Any = custom.get_namespaced_custom_object(*RAY[:2], ns, RAY[2], "rc")
                return dict(obj)

            until(lambda: ray()["spec"].get("suspend") is True, 150, "the RayCluster suspended")
            assert (ray()["metadata"].get("annotations") or {}).get(names.RECLAIMED) == "Suspend"
            until(lambda: not kuberay.pods(), 30, "the RayCluster's pods gone")

            # (3) Each reclaimed once, announced on the object the user restores.
            def status() -> dict[str, Any]:
                obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
                return dict(obj.get("status") or {})

            until(lambda: status().get("reclaimsTotal") == 2, 30, "two reclaims counted")
            owners = sorted(r["owner"] for r in status().get("reclamations") or [])
            assert owners == [f"{ns}/RayCluster/rc", f"{ns}/Workload/{kueue.name}"], owners
            reclaimed = until(
                lambda: event_count(core, ns, "Workload", kueue.name, names.EV_RECLAIMED) or None,
                30,
                "GPUReclaimed on the Workload",
            )
            assert reclaimed == 1
            # and on the Job, where its user looks, naming the Workload to restore
            job_events = core.list_namespaced_event(
                ns,
                field_selector=f"reason={names.EV_RECLAIMED},involvedObject.kind=Job,involvedObject.name=train",
            ).items
            assert [e.count or 1 for e in job_events] == [1], job_events
            assert f"gpu-efficiency restore workload/{kueue.name} -n {ns}" in job_events[0].message
            assert event_count(core, ns, "RayCluster", "rc", names.EV_RECLAIMED) == 1
            time.sleep(2 * 5 + 1)  # two more cycles: nothing acted on again
            assert status().get("reclaimsTotal") == 2, status()

            # (4) The way back: the Workload reactivated (Kueue admits it, the Job runs again), the
            # RayCluster resumed (KubeRay creates its pods again).
            restored = cli(cluster, "restore", f"workload/{kueue.name}", "-n", ns)
            assert restored.returncode == 0, restored.stdout + restored.stderr
            assert "reactivated (spec.active=true)" in restored.stdout
            left = workload()["metadata"].get("annotations") or {}
            assert not set(left) & set(names.OWNER_ANNOTATIONS), left
            until(lambda: running(job_pods()), 60, "the Job's pod running again after the restore")
            assert batch.read_namespaced_job("train", ns).spec.suspend is False

            restored = cli(cluster, "restore", "raycluster/rc", "-n", ns)
            assert restored.returncode == 0, restored.stdout + restored.stderr
            assert ray()["spec"].get("suspend") is False
            until(lambda: len(kuberay.pods()) == 2, 60, "the RayCluster's pods back after the restore")
            assert [e for p in players for e in p.errors] == []
        finally:
            for p in players:
                p.halt.set()
            done.set()
    result = bg.finish()
    assert result.passed, bg.report()
