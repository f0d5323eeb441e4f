"""The ground everything is proven on: the real API server, scheduler, controllers and KWOK."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.harness import CLUSTER_SH, Cluster, wait_for

GPU = "nvidia.com/gpu"


def _gpu_deployment(namespace: str, name: str, gpus: int = 1) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    termination_grace_period_seconds=2,
                    containers=[
                        client.V1Container(
                            name="main",
                            image="registry.k8s.io/pause:3.10",
                            resources=client.V1ResourceRequirements(
                                limits={GPU: str(gpus)}, requests={GPU: str(gpus)}
                            ),
                        )
                    ],
                ),
            ),
        ),
    )


def _running_pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def _evict(core: client.CoreV1Api, namespace: str, name: str) -> int:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    try:
        core.create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as exc:
        return int(exc.status)
    return 201


def test_crd_installed_with_short_name(cluster: Cluster) -> None:
    out = cluster.kubectl_run("get", "crd", "gpuefficiencypolicies.gpuefficiency.io", "-o", "json").stdout
    crd = json.loads(out)
    assert crd["spec"]["scope"] == "Cluster"
    assert "gep" in crd["spec"]["names"]["shortNames"]
    assert cluster.kubectl_run("get", "gep").returncode == 0


def test_kubectl_reports_the_real_version(cluster: Cluster) -> None:
    if cluster.bin_dir is None:
        pytest.skip("using an existing cluster: its kubectl is not ours to check")
    out = json.loads(cluster.kubectl_run("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"].startswith("v1.")
    assert out["serverVersion"]["gitVersion"] == out["clientVersion"]["gitVersion"]


def test_fake_gpu_nodes_report_gpus(k8s: client.ApiClient) -> None:
    nodes = client.CoreV1Api(k8s).list_node(label_selector="nvidia.com/gpu.present=true").items
    assert nodes, "no fake GPU nodes"
    for node in nodes:
        assert int(node.status.allocatable[GPU]) > 0
        assert node.metadata.labels.get("nvidia.com/gpu.product")
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready.get("Ready") == "True"


def test_gpu_pod_scheduled_running_and_eviction_respects_pdb(k8s: client.ApiClient, namespace: str) -> None:
    core, apps, policy = client.CoreV1Api(k8s), client.AppsV1Api(k8s), client.PolicyV1Api(k8s)
    apps.create_namespaced_deployment(namespace, _gpu_deployment(namespace, "trainer"))
    pods = wait_for(lambda: _running_pods(core, namespace, "app=trainer"), 60, what="a Running GPU pod")
    pod = pods[0]
    assert pod.spec.node_name, "the scheduler did not place the pod"
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels.get("nvidia.com/gpu.present") == "true"

    policy.create_namespaced_pod_disruption_budget(
        namespace,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="trainer"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels={"app": "trainer"})
            ),
        ),
    )
    wait_for(
        lambda: (
            (policy.read_namespaced_pod_disruption_budget("trainer", namespace).status.expected_pods or 0)
            == 1
        ),
        30,
        what="the PDB status to be computed",
    )
    assert _evict(core, namespace, pod.metadata.name) == 429

    policy.delete_namespaced_pod_disruption_budget("trainer", namespace)
    assert wait_for(
        lambda: _evict(core, namespace, pod.metadata.name) in (200, 201) or None, 30, what="eviction allowed"
    )

    def replaced() -> list[client.V1Pod] | None:
        running = _running_pods(core, namespace, "app=trainer")
        fresh = [p for p in running if p.metadata.uid != pod.metadata.uid]
        return fresh or None

    new = wait_for(replaced, 90, what="the Deployment's replacement pod")
    assert new[0].metadata.name != pod.metadata.name
    wait_for(
        lambda: (
            not any(p.metadata.uid == pod.metadata.uid for p in core.list_namespaced_pod(namespace).items)
        ),
        60,
        what="the evicted pod to be gone after its grace period",
    )


def test_job_pod_runs(k8s: client.ApiClient, namespace: str) -> None:
    core, batch = client.CoreV1Api(k8s), client.BatchV1Api(k8s)
    batch.create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(name="batch"),
            spec=client.V1JobSpec(
                backoff_limit=0,
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "batch"}),
                    spec=client.V1PodSpec(
                        restart_policy="Never",
                        containers=[
                            client.V1Container(
                                name="main",
                                image="registry.k8s.io/pause:3.10",
                                resources=client.V1ResourceRequirements(limits={GPU: "1"}),
                            )
                        ],
                    ),
                ),
            ),
        ),
    )
    wait_for(lambda: _running_pods(core, namespace, "app=batch"), 60, what="the Job's pod Running")


def test_fake_nodes_renew_leases_like_kubelets(k8s: client.ApiClient) -> None:
    """The default lease is a kubelet's (40 s, renewed every 10 s): the benchmark's longer one is
    opt-in (GPUEFF_KWOK_NODE_LEASE_DURATION_S)."""
    coord = client.CoordinationV1Api(k8s)
    leases = [
        lease
        for lease in coord.list_namespaced_lease("kube-node-lease").items
        if lease.metadata.name.startswith("gpu-node-")
    ]
    assert leases, "no lease for the fake GPU nodes"
    assert {lease.spec.lease_duration_seconds for lease in leases} == {40}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GPUEFF_KWOK_NODE_LEASE_DURATION_S", "abc", "a whole number of seconds from 10"),
        ("GPUEFF_KWOK_NODE_LEASE_DURATION_S", "5", "a whole number of seconds from 10"),
        ("GPUEFF_KWOK_NODE_LEASE_DURATION_S", "-40", "a whole number of seconds from 10"),
        ("GPUEFF_KWOK_NODE_STATUS_PERIOD_S", "0", "a whole number of seconds"),
        ("GPUEFF_KWOK_NODE_STATUS_PERIOD_S", "5m", "a whole number of seconds"),
    ],
)
def test_invalid_node_timing_is_refused_before_anything_starts(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "GPUEFF_STATE_DIR": str(state), name: value}
    up = subprocess.run([str(CLUSTER_SH), "up"], capture_output=True, text=True, env=env, timeout=120)
    assert up.returncode != 0
    assert f"{name} must be {message}, not '{value}'" in up.stderr
    made = {p.name for p in state.iterdir()} if state.exists() else set()
    assert made <= {".lock"}  # nothing made but the lock: no certificates, data or pid files
