"""The operator as a process on the real API server: validation, restart safety, steady state,
high availability and Prometheus outages (issue 3's "Done when" items that need procedures)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from tests.e2e.harness import CLUSTER_SH, Cluster, live_lease_holder, pod_events_after, wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401

PROFILE = "sim.gpuefficiency.io/profile"


# ---- helpers -------------------------------------------------------------------------------------


def deployment(namespace: str, name: str, profile: str, nodes: GPUNodes) -> client.V1Deployment:
    key, value = nodes.label
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels, annotations={PROFILE: profile}),
                spec=client.V1PodSpec(
                    termination_grace_period_seconds=1,
                    node_selector={key: value},
                    tolerations=[client.V1Toleration(key=key, operator="Exists", effect="NoSchedule")],
                    containers=[
                        client.V1Container(
                            name="main",
                            image="registry.k8s.io/pause:3.10",
                            resources=client.V1ResourceRequirements(limits={names.GPU_RESOURCE: "1"}),
                        )
                    ],
                ),
            ),
        ),
    )


def policy_body(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "interval": "3s",
        "window": "12s",
        "metrics": {"prometheus": {"scrapeInterval": "1s"}},
        "selection": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        "faults": {"enabled": False},
        # These tests follow the eviction path (leadership, restarts, missing metrics); the default
        # for a Deployment is to scale it to zero, which the owner-reclaim tests cover.
        "reclaim": {"actions": {"Deployment": "Evict"}},
    }
    base.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": name},
        "spec": base,
    }


@pytest.fixture
def policies(k8s: client.ApiClient) -> Iterator[list[str]]:
    """Names of policies a test creates; deleted afterwards (no finalizer: deletion is immediate)."""
    created: list[str] = []
    yield created
    custom = client.CustomObjectsApi(k8s)
    for name in created:
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def create_policy(k8s: client.ApiClient, created: list[str], body: dict[str, Any]) -> str:
    client.CustomObjectsApi(k8s).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    created.append(body["metadata"]["name"])
    return str(body["metadata"]["name"])


def get_policy(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    return obj


def condition(k8s: client.ApiClient, policy: str, type_: str) -> dict[str, Any] | None:
    for cond in (get_policy(k8s, policy).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return None


def running_pod(core: client.CoreV1Api, namespace: str, app: str) -> client.V1Pod | None:
    for pod in core.list_namespaced_pod(namespace, label_selector=f"app={app}").items:
        if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
            return pod
    return None


def annotations(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    try:
        return dict(core.read_namespaced_pod(name, namespace).metadata.annotations or {})
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise


def policy_events(k8s: client.ApiClient, policy: str, reason: str) -> int:
    events = client.CoreV1Api(k8s).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={policy}"
    )
    return sum(1 for e in events.items if e.reason == reason)


def gone_or_terminating(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        return core.read_namespaced_pod(name, namespace).metadata.deletion_timestamp is not None
    except ApiException as exc:
        return exc.status == 404


# ---- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"interval": "10m", "window": "5m"}, "window must be at least interval"),
        ({"interval": "0s"}, "interval must be at least 1s"),
        (
            {"interval": "10s", "window": "30s"},
            "window must be at least 4 x metrics.prometheus.scrapeInterval",
        ),
        ({"metrics": {"prometheus": {"scrapeInterval": "0s"}}}, "scrapeInterval must be longer than 0s"),
        (
            {"mode": "Enforce", "idle": {"warningPeriod": "0s"}},
            "warningPeriod must be longer than 0s in Enforce",
        ),
        ({"mode": "Destroy"}, 'Unsupported value: "Destroy"'),
        ({"idle": {"activityBelow": 3}}, "should be less than or equal to 1"),
        ({"interval": "ten"}, "spec.interval"),
        ({"faults": {"xid": {"critical": [79], "ignored": [79]}}}, "cannot be both critical and ignored"),
        ({"notAField": True}, 'unknown field "spec.notAField"'),
    ],
)
def test_invalid_policies_are_rejected_by_the_api_server(
    cluster: Cluster, spec: dict[str, Any], message: str, tmp_path: Any
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": f"bad-{uuid.uuid4().hex[:6]}"},
        "spec": spec,
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(body))
    proc = cluster.kubectl_run("apply", "-f", str(path), check=False)
    assert proc.returncode != 0, f"accepted: {proc.stdout}"
    assert message in proc.stderr, proc.stderr
    assert cluster.kubectl_run("get", "gep", body["metadata"]["name"], check=False).returncode != 0


def test_invalid_policy_the_schema_cannot_catch_is_reported(
    k8s: client.ApiClient, namespace: str, start_operator: Any, policies: list[str]
) -> None:
    """`In` with no values passes OpenAPI but means nothing: PolicyValid=False and one event."""
    name = f"invalid-{uuid.uuid4().hex[:6]}"
    body = policy_body(name, namespace)
    body["spec"]["selection"]["podSelector"] = {
        "matchExpressions": [{"key": "app", "operator": "In", "values": []}]
    }
    start_operator()
    create_policy(k8s, policies, body)
    cond = wait_for(lambda: condition(k8s, name, names.COND_VALID), 60, what="PolicyValid condition")
    assert cond["status"] == "False"
    assert "matchExpressions" in cond["message"]
    assert (
        wait_for(lambda: policy_events(k8s, name, names.EV_POLICY_INVALID), 30, what="PolicyInvalid event")
        == 1
    )
    time.sleep(7)  # two more cycles: the event is not repeated
    assert policy_events(k8s, name, names.EV_POLICY_INVALID) == 1


# ---- idle lifecycle across a restart, steady state ------------------------------------------------


def test_restart_mid_warning_keeps_the_clock_and_evicts_once(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, deployment(namespace, "notebook", "idle", gpu_nodes))
    apps.create_namespaced_deployment(namespace, deployment(namespace, "trainer", "compute-bound", gpu_nodes))
    name = create_policy(
        k8s,
        policies,
        policy_body(
            f"restart-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "3s", "warningPeriod": "25s"},
        ),
    )
    operator = start_operator()
    pod = wait_for(lambda: running_pod(core, namespace, "notebook"), 60, what="notebook running")
    pod_name = pod.metadata.name
    warned = wait_for(
        lambda: (a := annotations(core, namespace, pod_name)).get(names.EVICT_AFTER) and a,
        90,
        what="the evict-after warning",
    )

    operator.kill()  # SIGKILL mid-warning: no graceful anything
    time.sleep(2)
    operator.start()
    time.sleep(8)  # a few cycles of the restarted operator
    now = annotations(core, namespace, pod_name)
    if now:  # unless already evicted, the clock and the warning are unchanged
        assert now[names.IDLE_SINCE] == warned[names.IDLE_SINCE]
        assert now[names.EVICT_AFTER] == warned[names.EVICT_AFTER]

    wait_for(lambda: gone_or_terminating(core, namespace, pod_name), 90, what="the eviction")
    events = pod_events_after(k8s, namespace, pod_name, names.EV_EVICTED)
    assert events.count(names.EV_EVICTION_SCHEDULED) == 1
    assert events.count(names.EV_EVICTED) == 1
    wait_for(
        lambda: (get_policy(k8s, name).get("status") or {}).get("evictionsTotal") == 1,
        30,
        what="evictionsTotal 1",
    )

    # The replacement pod starts with a fresh clock: nothing inherited, warming up first.
    fresh = wait_for(
        lambda: (p := running_pod(core, namespace, "notebook")) and p.metadata.name != pod_name and p,
        60,
        what="the replacement pod",
    )
    assert names.IDLE_SINCE not in (fresh.metadata.annotations or {})
    assert names.EVICT_AFTER not in (fresh.metadata.annotations or {})

    # Steady state: scale the idle workload away, let the trainer settle, then no writes at all.
    apps.patch_namespaced_deployment_scale("notebook", namespace, {"spec": {"replicas": 0}})
    trainer = wait_for(lambda: running_pod(core, namespace, "trainer"), 30, what="trainer")
    wait_for(
        lambda: annotations(core, namespace, trainer.metadata.name).get(names.STATE) == "Efficient",
        60,
        what="trainer Efficient",
    )
    wait_for(
        lambda: (
            running_pod(core, namespace, "notebook") is None
            and not core.list_namespaced_pod(namespace, label_selector="app=notebook").items
        ),
        60,
        what="the notebook scaled away",
    )
    time.sleep(7)

    def versions() -> tuple[str, str, int]:
        t = core.read_namespaced_pod(trainer.metadata.name, namespace).metadata.resource_version
        p = get_policy(k8s, name)["metadata"]["resourceVersion"]
        n = len(core.list_namespaced_event(namespace).items) + policy_events(k8s, name, names.EV_EVICTED)
        return t, p, n

    before = versions()
    time.sleep(12)  # four cycles
    assert versions() == before, "a steady cluster got writes"
    assert operator.alive()
    assert operator.log().count("cycle failed") == 0


# ---- high availability ---------------------------------------------------------------------------


def test_two_replicas_exactly_one_acts_and_the_other_takes_over(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    first, second = start_operator(), start_operator()
    # A previous test's killed operator may still hold an unexpired lease: wait for one of ours.
    holder = wait_for(
        lambda: (h := live_lease_holder(k8s)) in (first.name, second.name) and h,
        60,
        what="one of us to lead",
    )
    leader, standby = (first, second) if holder == first.name else (second, first)

    apps.create_namespaced_deployment(namespace, deployment(namespace, "notebook", "idle", gpu_nodes))
    name = create_policy(
        k8s,
        policies,
        policy_body(
            f"ha-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "3s", "warningPeriod": "5s"},
        ),
    )
    pod = wait_for(lambda: running_pod(core, namespace, "notebook"), 60, what="notebook running")
    wait_for(lambda: gone_or_terminating(core, namespace, pod.metadata.name), 90, what="the eviction")
    events = pod_events_after(k8s, namespace, pod.metadata.name, names.EV_EVICTED)
    assert events.count(names.EV_IDLE) == 1
    assert events.count(names.EV_EVICTION_SCHEDULED) == 1
    assert events.count(names.EV_EVICTED) == 1
    assert "cycle" in leader.log()
    assert "policy " + name + ": cycle" not in standby.log(), "the standby replica acted"

    # The leader dies; the standby takes the lease and carries on with the replacement pod.
    leader.kill()
    wait_for(lambda: live_lease_holder(k8s) == standby.name, 30, what="the standby to take the lease")
    fresh = wait_for(
        lambda: (
            (p := running_pod(core, namespace, "notebook")) and p.metadata.name != pod.metadata.name and p
        ),
        60,
        what="the replacement pod",
    )
    wait_for(
        lambda: gone_or_terminating(core, namespace, fresh.metadata.name),
        120,
        what="the standby evicting the idle replacement",
    )
    assert f"policy {name}: cycle" in standby.log()


# ---- Prometheus down -----------------------------------------------------------------------------


@pytest.fixture
def prometheus_outage(cluster: Cluster) -> Iterator[Any]:
    """Stop and restart the local Prometheus; always restarted afterwards."""
    if cluster.state_dir is None:
        pytest.skip("GPUEFF_USE_EXISTING_CLUSTER: the cluster's Prometheus is not ours to stop")
    env = {**os.environ, "GPUEFF_STATE_DIR": str(cluster.state_dir)}
    import subprocess

    def run(verb: str) -> None:
        subprocess.run([str(CLUSTER_SH), verb], env=env, check=True, capture_output=True, timeout=120)

    try:
        yield run
    finally:
        run("prometheus-up")


def test_prometheus_down_never_evicts_and_says_so(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],
    prometheus_outage: Any,
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, deployment(namespace, "notebook", "idle", gpu_nodes))
    name = create_policy(
        k8s,
        policies,
        policy_body(
            f"promdown-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "3s", "warningPeriod": "15s"},
        ),
    )
    start_operator()
    pod = wait_for(lambda: running_pod(core, namespace, "notebook"), 60, what="notebook running")
    wait_for(
        lambda: annotations(core, namespace, pod.metadata.name).get(names.EVICT_AFTER), 90, what="the warning"
    )

    prometheus_outage("prometheus-down")
    cond = wait_for(
        lambda: (c := condition(k8s, name, names.COND_METRICS)) and c["status"] == "False" and c,
        30,
        what="MetricsAvailable=False",
    )
    assert "unreachable" in cond["message"] or "Prometheus" in cond["message"]
    assert wait_for(lambda: policy_events(k8s, name, names.EV_METRICS_UNAVAILABLE), 30, what="event") >= 1
    time.sleep(25)  # well past evict-after: still no eviction while blind
    assert not gone_or_terminating(core, namespace, pod.metadata.name)
    assert annotations(core, namespace, pod.metadata.name).get(names.EVICT_AFTER)

    prometheus_outage("prometheus-up")
    wait_for(
        lambda: (c := condition(k8s, name, names.COND_METRICS)) and c["status"] == "True",
        60,
        what="MetricsAvailable=True again",
    )
    # Back to normal: the warning was kept, and the idle pod is evicted once data confirms it.
    wait_for(
        lambda: gone_or_terminating(core, namespace, pod.metadata.name),
        90,
        what="the eviction after recovery",
    )


def test_deleting_a_policy_is_immediate_and_keeps_annotations(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    start_operator: Any,
    policies: list[str],
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, deployment(namespace, "trainer", "compute-bound", gpu_nodes))
    name = create_policy(k8s, policies, policy_body(f"delete-{uuid.uuid4().hex[:6]}", namespace))
    operator = start_operator()
    pod = wait_for(lambda: running_pod(core, namespace, "trainer"), 60, what="trainer running")
    wait_for(
        lambda: annotations(core, namespace, pod.metadata.name).get(names.STATE) == "Efficient",
        60,
        what="the verdict",
    )
    assert not get_policy(k8s, name)["metadata"].get("finalizers")
    operator.kill()  # even with the operator down, deletion must not hang
    client.CustomObjectsApi(k8s).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    wait_for(lambda: _policy_gone(k8s, name), 10, what="the policy to be deleted")
    assert annotations(core, namespace, pod.metadata.name).get(names.STATE) == "Efficient"


def _policy_gone(k8s: client.ApiClient, name: str) -> bool:
    try:
        get_policy(k8s, name)
    except ApiException as exc:
        return exc.status == 404
    return False
