"""Owners from CRDs on the real local cluster (issue 32): a Job admitted by Kueue is reclaimed by
deactivating its Workload, never by suspending the Job behind Kueue's back; a RayCluster, a RayJob, a
PyTorchJob, an MPIJob, a TFJob and a TrainJob are suspended at their own switch; `gpu-efficiency
restore` brings each back.

The CRDs are installed unchanged from tests/e2e/crds/ (each file names its project, tag and commit):
Kueue's Workload (kubernetes-sigs/kueue v0.19.2), KubeRay's RayCluster and RayJob (ray-project/kuberay
v1.7.0), training-operator's PyTorchJob, MPIJob and TFJob (kubeflow/training-operator v1.9.0),
Trainer's TrainJob (kubeflow/trainer v2.3.0) and the JobSet it runs (kubernetes-sigs/jobset v0.12.0).
Their managers are not run here (Kueue's needs its webhooks, queues and flavours; none is built by
the local cluster), so the test plays their part, as the Notebook test plays Kubeflow's, doing what
their controllers do for these objects:

* Kueue (pkg/controller/jobframework/reconciler.go, pkg/controller/core/workload_controller.go): a
  Workload controlled by the Job, admitted (QuotaReserved, Admitted), then the Job unsuspended; a
  Workload with spec.active=false evicted (Evicted, reason Deactivated), its admission cleared and
  the Job suspended; reactivated, admitted again and the Job unsuspended.
* KubeRay (ray-operator/controllers/ray/raycluster_controller.go): head and worker pods controlled by
  the RayCluster; with spec.suspend=true all of them deleted and RayClusterSuspended set; resumed,
  the pods created again. For a RayJob (rayjob_controller.go): a RayCluster controlled by the RayJob
  with its GPU worker; suspended, that RayCluster deleted; resumed, a new one created.
* training-operator (pkg/controller.v1/common): a worker pod controlled by the PyTorchJob, MPIJob or
  TFJob, labelled training.kubeflow.org/job-name; with runPolicy.suspend=true deleted; resumed,
  created again.
* Trainer and JobSet (trainer pkg/runtime/framework/plugins/jobset, jobset jobset_controller.go): a
  JobSet controlled by the TrainJob and a Job controlled by the JobSet, each given its parent's
  suspend.

The real Job controller (kube-controller-manager) runs the Jobs' pods and deletes them when a Job is
suspended (by Kueue for the admitted Job, by the JobSet for the TrainJob's).
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
from gpu_efficiency.api.suspend_fields import is_suspended
from gpu_efficiency_sim.simulator import PROFILE_ANNOTATION
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario
from tests.e2e.test_reclaim_e2e import event_count, waiting_pod
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).parent / "crds"
KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")
RAY = ("ray.io", "v1", "rayclusters")
RAYJOB = ("ray.io", "v1", "rayjobs")
KUBEFLOW = {
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "MPIJob": ("kubeflow.org", "v1", "mpijobs"),
    "TFJob": ("kubeflow.org", "v1", "tfjobs"),
}
#: each training-operator kind's replica specs field (pkg/apis/kubeflow.org/v1/*_types.go)
REPLICA_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs", "TFJob": "tfReplicaSpecs"}
TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
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


def suspended(
    custom: client.CustomObjectsApi, api: tuple[str, str, str], ns: str, kind: str, name: str
) -> bool:
    obj: Any = custom.get_namespaced_custom_object(*api[:2], ns, api[2], name)
    return is_suspended(kind, obj.get("spec") or {})


def live(pods: list[client.V1Pod]) -> list[client.V1Pod]:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


class PlayedTrainingOperator:
    """Kubeflow training-operator v1.9.0's part for one PyTorchJob, MPIJob or TFJob
    (pkg/controller.v1/common/job.go, pod.go): its worker pod ``NAME-worker-0``, controlled by the
    job and labelled training.kubeflow.org/*; with runPolicy.suspend=true its pods deleted; resumed,
    created again."""

    def __init__(self, k8s: client.ApiClient, ns: str, job: dict[str, Any], scenario: str, node: str):
        self.custom = client.CustomObjectsApi(k8s)
        self.core = client.CoreV1Api(k8s)
        self.ns, self.job = ns, job
        self.kind: str = job["kind"]
        self.name: str = job["metadata"]["name"]
        self.scenario, self.node = scenario, node
        self.player = Player(f"played-{self.kind.lower()}", self.step)

    def pods(self) -> list[client.V1Pod]:
        selector = f"training.kubeflow.org/job-name={self.name}"
        return live(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    def step(self) -> None:
        api = KUBEFLOW[self.kind]
        suspend = suspended(self.custom, api, self.ns, self.kind, self.name)
        pods = self.pods()
        if suspend and pods:
            for pod in pods:
                self.core.delete_namespaced_pod(pod.metadata.name, self.ns, grace_period_seconds=0)
            self.player.log.append("suspended: pods deleted")
        elif not suspend and not pods:
            labels = {
                "training.kubeflow.org/job-name": self.name,
                "training.kubeflow.org/operator-name": f"{self.kind.lower()}-controller",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "0",
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{self.name}-worker-0",
                    "labels": labels,
                    "annotations": {PROFILE_ANNOTATION: "idle"},
                    "ownerReferences": [controlled_by(self.job, "kubeflow.org/v1", self.kind)],
                },
                "spec": gpu_pod_spec(self.scenario, self.node, 1),
            }
            self.core.create_namespaced_pod(self.ns, pod)
            self.player.log.append("pods created")


class PlayedRayJob:
    """KubeRay v1.7.0's part for one RayJob (ray-operator/controllers/ray/rayjob_controller.go): a
    RayCluster controlled by the RayJob with its GPU worker pod; with spec.suspend=true the
    RayCluster (and its pods) deleted; resumed, a new RayCluster created."""

    def __init__(self, k8s: client.ApiClient, ns: str, job: dict[str, Any], scenario: str, node: str):
        self.custom = client.CustomObjectsApi(k8s)
        self.core = client.CoreV1Api(k8s)
        self.ns, self.job = ns, job
        self.name: str = job["metadata"]["name"]
        self.scenario, self.node = scenario, node
        self.clusters = 0
        self.player = Player("played-rayjob", self.step)

    def ray_clusters(self) -> list[dict[str, Any]]:
        found: Any = self.custom.list_namespaced_custom_object(
            *RAY[:2], self.ns, RAY[2], label_selector=f"ray.io/originated-from-cr-name={self.name}"
        )
        return [c for c in found["items"] if not c["metadata"].get("deletionTimestamp")]

    def pods(self) -> list[client.V1Pod]:
        names_ = {c["metadata"]["name"] for c in self.ray_clusters()}
        found = self.core.list_namespaced_pod(self.ns, label_selector="ray.io/node-type=worker").items
        return [p for p in live(found) if (p.metadata.labels or {}).get("ray.io/cluster") in names_]

    def step(self) -> None:
        suspend = suspended(self.custom, RAYJOB, self.ns, "RayJob", self.name)
        clusters = self.ray_clusters()
        if suspend and clusters:
            for rc in clusters:
                rc_name = rc["metadata"]["name"]
                for pod in live(
                    self.core.list_namespaced_pod(self.ns, label_selector=f"ray.io/cluster={rc_name}").items
                ):
                    self.core.delete_namespaced_pod(pod.metadata.name, self.ns, grace_period_seconds=0)
                self.custom.delete_namespaced_custom_object(*RAY[:2], self.ns, RAY[2], rc_name)
            self.player.log.append("suspended: RayCluster deleted")
        elif not suspend and not clusters:
            self.clusters += 1
            rc_body = {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": {
                    "name": f"{self.name}-raycluster-{self.clusters}",
                    "labels": {
                        "ray.io/originated-from-cr-name": self.name,
                        "ray.io/originated-from-crd": "RayJob",
                    },
                    "ownerReferences": [controlled_by(self.job, "ray.io/v1", "RayJob")],
                },
                "spec": self.job["spec"]["rayClusterSpec"],
            }
            created: Any = self.custom.create_namespaced_custom_object(*RAY[:2], self.ns, RAY[2], rc_body)
            rc_name = created["metadata"]["name"]
            self.core.create_namespaced_pod(
                self.ns,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": f"{rc_name}-gpu-worker-",
                        "labels": {"ray.io/cluster": rc_name, "ray.io/node-type": "worker"},
                        "annotations": {PROFILE_ANNOTATION: "idle"},
                        "ownerReferences": [controlled_by(dict(created), "ray.io/v1", "RayCluster")],
                    },
                    "spec": gpu_pod_spec(self.scenario, self.node, 1),
                },
            )
            self.player.log.append(f"RayCluster {rc_name} created")


class PlayedTrainer:
    """Kubeflow Trainer v2.3.0's and JobSet v0.12.0's part for one TrainJob (trainer
    pkg/runtime/framework/plugins/jobset, jobset pkg/controllers/jobset_controller.go): a JobSet of
    the TrainJob's name controlled by it, with the TrainJob's suspend; the JobSet's Job
    ``NAME-node-0`` controlled by the JobSet, with the JobSet's suspend. The real Job controller
    runs the pod, deletes it while suspended and creates it again when resumed."""

    def __init__(self, k8s: client.ApiClient, ns: str, job: dict[str, Any], template: dict[str, Any]):
        self.custom = client.CustomObjectsApi(k8s)
        self.batch = client.BatchV1Api(k8s)
        self.core = client.CoreV1Api(k8s)
        self.ns, self.job, self.template = ns, job, template
        self.name: str = job["metadata"]["name"]
        self.child = f"{self.name}-node-0"
        self.player = Player("played-trainer", self.step)

    def pods(self) -> list[client.V1Pod]:
        return live(self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={self.child}").items)

    def step(self) -> None:
        suspend = suspended(self.custom, TRAINJOB, self.ns, "TrainJob", self.name)
        try:
            jobset: Any = self.custom.get_namespaced_custom_object(*JOBSET[:2], self.ns, JOBSET[2], self.name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            replicated = {"name": "node", "replicas": 1, "template": {"spec": {"template": self.template}}}
            body = {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {
                    "name": self.name,
                    "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
                    "ownerReferences": [controlled_by(self.job, "trainer.kubeflow.org/v1alpha1", "TrainJob")],
                },
                "spec": {"suspend": suspend, "replicatedJobs": [replicated]},
            }
            jobset = self.custom.create_namespaced_custom_object(*JOBSET[:2], self.ns, JOBSET[2], body)
            self.player.log.append("JobSet created")
        if is_suspended("JobSet", jobset["spec"]) != suspend:
            self.custom.patch_namespaced_custom_object(
                *JOBSET[:2], self.ns, JOBSET[2], self.name, {"spec": {"suspend": suspend}}
            )
            self.player.log.append(f"JobSet suspend={suspend}")
        try:
            child = self.batch.read_namespaced_job(self.child, self.ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": self.child,
                    "labels": {
                        "jobset.sigs.k8s.io/jobset-name": self.name,
                        "jobset.sigs.k8s.io/replicatedjob-name": "node",
                    },
                    "ownerReferences": [controlled_by(dict(jobset), "jobset.x-k8s.io/v1alpha2", "JobSet")],
                },
                "spec": {"suspend": suspend, "backoffLimit": 0, "template": self.template},
            }
            self.batch.create_namespaced_job(self.ns, body)
            self.player.log.append("Job created")
            return
        if bool(child.spec.suspend) != suspend:
            self.batch.patch_namespaced_job(self.child, self.ns, {"spec": {"suspend": suspend}})
            self.player.log.append(f"Job suspend={suspend}")


def test_each_crd_owner_is_reclaimed_at_its_own_switch_then_restored(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    batch = client.BatchV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy = "crd-owners"
    # before the operator starts: its discovery finds both integrations
    install_vendored_crd(k8s, "kueue-v0.19.2-workloads.yaml")
    install_vendored_crd(k8s, "kuberay-v1.7.0-rayclusters.yaml")
    for file in (
        "kuberay-v1.7.0-rayjobs.yaml",
        "training-operator-v1.9.0-pytorchjobs.yaml",
        "training-operator-v1.9.0-mpijobs.yaml",
        "training-operator-v1.9.0-tfjobs.yaml",
        "trainer-v2.3.0-trainjobs.yaml",
        "jobset-v0.12.0-jobsets.yaml",
    ):
        install_vendored_crd(k8s, file)
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
            # A RayJob (KubeRay suspends only those with shutdownAfterJobFinishes), its RayCluster
            # and GPU worker played; a PyTorchJob, MPIJob and TFJob, each with one GPU worker pod
            # played; a TrainJob, its JobSet and Job played (the real Job controller runs the pod).
            rayjob: Any = custom.create_namespaced_custom_object(
                *RAYJOB[:2],
                ns,
                RAYJOB[2],
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJob",
                    "metadata": {"name": "rj"},
                    "spec": {
                        "entrypoint": "python train.py",
                        "shutdownAfterJobFinishes": True,
                        "rayClusterSpec": ray_spec,
                    },
                },
            )
            played_rayjob = PlayedRayJob(k8s, ns, dict(rayjob), bg.run.name, node)
            training: dict[str, PlayedTrainingOperator] = {}
            for kind, (group, version, plural) in KUBEFLOW.items():
                replica = {"replicas": 1, "template": {"spec": gpu_pod_spec(bg.run.name, node, 1)}}
                tj: Any = custom.create_namespaced_custom_object(
                    group,
                    version,
                    ns,
                    plural,
                    {
                        "apiVersion": f"{group}/{version}",
                        "kind": kind,
                        "metadata": {"name": kind.lower()},
                        "spec": {"runPolicy": {"suspend": False}, REPLICA_SPECS[kind]: {"Worker": replica}},
                    },
                )
                training[kind] = PlayedTrainingOperator(k8s, ns, dict(tj), bg.run.name, node)
            trainjob: Any = custom.create_namespaced_custom_object(
                *TRAINJOB[:2],
                ns,
                TRAINJOB[2],
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "metadata": {"name": "tj"},
                    "spec": {"runtimeRef": {"name": "torch-distributed"}},
                },
            )
            trainer = PlayedTrainer(k8s, ns, dict(trainjob), template)
            players.extend((kueue.player, kuberay.player, played_rayjob.player, trainer.player))
            players.extend(t.player for t in training.values())
            for p in players:
                p.start()

            def job_pods() -> list[client.V1Pod]:
                found = core.list_namespaced_pod(ns, label_selector="job-name=train").items
                return [p for p in found if p.metadata.deletion_timestamp is None]

            def running(pods: list[client.V1Pod]) -> bool:
                return bool(pods) and all(p.status.phase == "Running" for p in pods)

            until(lambda: running(job_pods()), 60, "the admitted Job's pod running")
            until(lambda: len(kuberay.pods()) == 2, 60, "the RayCluster's head and worker pods")
            #: kind -> (its plural's API, its name, its GPU pods now), for the kinds suspended at their own switch
            suspendable: dict[str, tuple[tuple[str, str, str], str, Callable[[], list[client.V1Pod]]]] = {
                "RayJob": (RAYJOB, "rj", played_rayjob.pods),
                **{kind: (KUBEFLOW[kind], kind.lower(), t.pods) for kind, t in training.items()},
                "TrainJob": (
                    TRAINJOB,
                    "tj",
                    lambda: [p for p in trainer.pods() if p.status.phase == "Running"],
                ),
            }
            for kind, (_, _, pods) in suspendable.items():
                until(lambda pods=pods: len(pods()) == 1, 60, f"the {kind}'s GPU pod")

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

            # (2b) RayJob, PyTorchJob, MPIJob, TFJob and TrainJob suspended at their own switch; their
            # controllers (played; the Job controller for the TrainJob's Job) delete their pods.
            for kind, (api, name, pods) in suspendable.items():
                until(
                    lambda a=api, k=kind, n=name: suspended(custom, a, ns, k, n), 150, f"the {kind} suspended"
                )
                obj: Any = custom.get_namespaced_custom_object(*api[:2], ns, api[2], name)
                ann = obj["metadata"].get("annotations") or {}
                assert ann.get(names.RECLAIMED) == "Suspend", (kind, ann)
                assert ann.get(names.RECLAIMED_BY) == policy, (kind, ann)
                until(lambda pods=pods: not pods(), 60, f"the {kind}'s GPU pod gone")

            # (3) Each reclaimed once, announced on the object the user restores.
            def status() -> dict[str, Any]:
                obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
                return dict(obj.get("status") or {})

            total = 2 + len(suspendable)
            until(lambda: status().get("reclaimsTotal") == total, 30, f"{total} reclaims counted")
            owners = sorted(r["owner"] for r in status().get("reclamations") or [])
            expected = [f"{ns}/RayCluster/rc", f"{ns}/Workload/{kueue.name}"]
            expected += [f"{ns}/{kind}/{name}" for kind, (_, name, _) in suspendable.items()]
            assert owners == sorted(expected), owners
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
            for kind, (_, name, _) in suspendable.items():
                assert event_count(core, ns, kind, name, names.EV_RECLAIMED) == 1, kind
            time.sleep(2 * 5 + 1)  # two more cycles: nothing acted on again
            assert status().get("reclaimsTotal") == total, status()

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

            for kind, (api, name, _) in suspendable.items():
                restored = cli(cluster, "restore", f"{kind.lower()}/{name}", "-n", ns)
                if restored.returncode != 0:
                    pods_now = [
                        (
                            p.metadata.name,
                            p.status.phase,
                            p.status.start_time,
                            p.metadata.deletion_timestamp,
                            [(o.kind, o.name) for o in p.metadata.owner_references or []],
                        )
                        for p in core.list_namespaced_pod(ns).items
                    ]
                    recs = [r for r in status().get("reclamations") or [] if kind in r["owner"]]
                    raise AssertionError(
                        f"{restored.stderr}\nrecords: {recs}\npods: {pods_now}\n{bg.report()}"
                    )
                assert "resumed" in restored.stdout, restored.stdout
                assert not suspended(custom, api, ns, kind, name), kind
                obj = custom.get_namespaced_custom_object(*api[:2], ns, api[2], name)
                left = obj["metadata"].get("annotations") or {}
                assert not set(left) & set(names.OWNER_ANNOTATIONS), (kind, left)
            for kind, (_, _, pods) in suspendable.items():
                until(lambda pods=pods: len(pods()) == 1, 60, f"the {kind}'s GPU pod back after the restore")
            assert [e for p in players for e in p.errors] == []
        finally:
            for p in players:
                p.halt.set()
            done.set()
    result = bg.finish()
    assert result.passed, bg.report()
