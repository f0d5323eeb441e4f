"""Overlapping policies on the real API server (issue 21): the older policy judges the pods both
select, and the younger one says so (a Shadowed condition naming the winner, and one event) instead
of reporting ``Ready, 0 pods evaluated`` in silence. Deleting the older hands the pods over."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from tests.e2e.harness import wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_operator import (
    condition,
    create_policy,
    deployment,
    get_policy,
    policies,  # noqa: F401
    policy_body,
    policy_events,
    running_pod,
)

pytestmark = pytest.mark.e2e


def status_of(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    return dict(get_policy(k8s, name).get("status") or {})


def judged_by(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    """The policy named on the pod as the one that judged it."""
    found = core.read_namespaced_pod(pod, namespace).metadata
    return str(((found and found.annotations) or {}).get(names.POLICY, ""))


def shadowed(k8s: client.ApiClient, name: str, state: str) -> dict[str, Any] | None:
    """The policy's Shadowed condition once its status is ``state``."""
    found = condition(k8s, name, names.COND_SHADOWED)
    return found if found and found["status"] == state else None


def test_a_shadowed_policy_says_so_and_takes_over_when_the_older_goes(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],  # noqa: F811
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, deployment(namespace, "trainer", "compute-bound", gpu_nodes))
    run = uuid.uuid4().hex[:6]
    # Precedence is (creationTimestamp, name): a second apart and in name order, "older" is older.
    older = create_policy(k8s, policies, policy_body(f"older-{run}", namespace))
    time.sleep(1.1)
    younger = create_policy(k8s, policies, policy_body(f"younger-{run}", namespace))
    start_operator()
    trainer = wait_for(lambda: running_pod(core, namespace, "trainer"), 60, what="trainer running")
    assert trainer.metadata is not None
    pod = str(trainer.metadata.name)

    # The older policy judges the pod; the younger one evaluates nothing and says why, naming it.
    wait_for(
        lambda: judged_by(core, namespace, pod) == older,
        60,
        what=f"the pod judged by {older}",
    )
    wait_for(lambda: status_of(k8s, older).get("podsEvaluated") == 1, 30, what="older: podsEvaluated 1")
    cond = wait_for(lambda: shadowed(k8s, younger, "True"), 30, what="younger: Shadowed=True")
    assert cond["reason"] == "OlderPolicyOverlaps", cond
    assert f"{older} (1 pod)" in cond["message"], cond
    assert "narrow the selections" in cond["message"], cond
    # Ready follows the metrics: a first cycle that runs before Prometheus' first scrape of the
    # test's simulator says "no dcgm-exporter series found" (Ready=False) until the next one.
    wait_for(
        lambda: (condition(k8s, younger, names.COND_READY) or {}).get("status") == "True" or None,
        30,
        what="younger: Ready=True once the simulator is scraped",
    )
    assert status_of(k8s, younger).get("podsEvaluated", 0) == 0, status_of(k8s, younger)
    assert wait_for(
        lambda: policy_events(k8s, younger, names.EV_POLICY_SHADOWED), 30, what="the PolicyShadowed event"
    )
    assert shadowed(k8s, older, "False"), condition(k8s, older, names.COND_SHADOWED)
    time.sleep(7)  # two more cycles: the condition stays, the event is not repeated
    assert shadowed(k8s, younger, "True"), condition(k8s, younger, names.COND_SHADOWED)
    assert policy_events(k8s, younger, names.EV_POLICY_SHADOWED) == 1
    assert policy_events(k8s, older, names.EV_POLICY_SHADOWED) == 0

    # The older policy goes: the younger one is no longer shadowed and judges the pod itself.
    client.CustomObjectsApi(k8s).delete_cluster_custom_object(GROUP, VERSION, PLURAL, older)
    cond = wait_for(lambda: shadowed(k8s, younger, "False"), 30, what="younger: Shadowed=False")
    assert cond["reason"] == "NoOverlap", cond
    wait_for(lambda: status_of(k8s, younger).get("podsEvaluated") == 1, 30, what="younger: podsEvaluated 1")
    wait_for(
        lambda: judged_by(core, namespace, pod) == younger,
        30,
        what=f"the pod judged by {younger}",
    )
    assert policy_events(k8s, younger, names.EV_POLICY_SHADOWED) == 1
