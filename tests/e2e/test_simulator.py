"""The simulator against the real API server and Prometheus: series carry the labels of the pods
the scheduler really placed, and lose them when the pods go."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.harness import prom_query, wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator

__all__ = ["gpu_nodes", "simulator"]  # fixtures used below

pytestmark = pytest.mark.e2e


def deployment(name: str, replicas: int, gpus: int, label: tuple[str, str]) -> dict[str, Any]:
    selector = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "nodeSelector": {label[0]: label[1]},
                    "tolerations": [
                        {"key": label[0], "operator": "Equal", "value": label[1], "effect": "NoSchedule"}
                    ],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def running_pods(core: client.CoreV1Api, namespace: str, app: str) -> dict[str, client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return {
        p.metadata.name: p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    }


def test_prometheus_series_carry_the_labels_of_the_real_pods(
    k8s: client.ApiClient,
    namespace: str,
    prometheus_url: str,
    gpu_nodes: GPUNodes,
    simulator: RunningSimulator,
) -> None:
    core = client.CoreV1Api(k8s)
    client.AppsV1Api(k8s).create_namespaced_deployment(
        namespace, deployment("trainer", 3, 2, gpu_nodes.label)
    )
    pods = wait_for(
        lambda: (p := running_pods(core, namespace, "trainer")) and len(p) == 3 and p,
        60,
        what="3 trainer pods Running",
    )

    def series() -> list[tuple[dict[str, str], float]] | None:
        found = prom_query(
            prometheus_url, f'DCGM_FI_DEV_GPU_UTIL{{simulator="{simulator.target}", namespace="{namespace}"}}'
        )
        return found if len(found) == 6 else None

    found = wait_for(series, 60, what="6 attributed GPU series in Prometheus")
    by_pod: dict[str, set[tuple[str, str]]] = {}
    for labels, _ in found:
        assert labels["container"] == "cuda"
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        by_pod.setdefault(labels["pod"], set()).add((labels["Hostname"], labels["gpu"]))
    assert set(by_pod) == set(pods), "every series belongs to a real pod and every pod has series"
    for name, gpus in by_pod.items():
        assert len(gpus) == 2, f"{name} requested 2 GPUs"
        assert {host for host, _ in gpus} == {pods[name].spec.node_name}, "series sit on the pod's real node"
    all_gpus = [g for gpus in by_pod.values() for g in gpus]
    assert len(set(all_gpus)) == 6, "no GPU is attributed twice"
    free = prom_query(prometheus_url, f'DCGM_FI_DEV_GPU_UTIL{{simulator="{simulator.target}", pod=""}}')
    assert len(free) == 2, "the other GPUs of the two 4-GPU nodes are free, without pod labels"


def test_a_deleted_pod_releases_its_gpus(
    k8s: client.ApiClient,
    namespace: str,
    prometheus_url: str,
    gpu_nodes: GPUNodes,
    simulator: RunningSimulator,
) -> None:
    core = client.CoreV1Api(k8s)
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, deployment("solo", 1, 1, gpu_nodes.label))
    (victim,) = wait_for(lambda: running_pods(core, namespace, "solo"), 60, what="solo pod Running")
    promql = f'DCGM_FI_DEV_GPU_UTIL{{simulator="{simulator.target}", pod="{victim}"}}'
    wait_for(lambda: prom_query(prometheus_url, promql), 60, what=f"series of {victim}")
    core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
    wait_for(
        lambda: all(h.pod.name != victim for hs in simulator.sim.holders().values() for h in hs),
        30,
        what=f"the simulator releasing {victim}'s GPU",
    )
    time.sleep(3)  # a couple of scrapes: Prometheus marks the vanished series stale
    assert prom_query(prometheus_url, promql) == []
    replacement = wait_for(lambda: running_pods(core, namespace, "solo"), 60, what="the replacement pod")
    (name,) = replacement
    assert name != victim
    promql = f'DCGM_FI_DEV_GPU_UTIL{{simulator="{simulator.target}", pod="{name}"}}'
    wait_for(lambda: prom_query(prometheus_url, promql), 60, what="series of the replacement pod")
