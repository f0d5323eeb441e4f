"""Owner-aware reclamation on the real local cluster (issue 17): each idle owner gets its action,
the freed GPUs run a pod that was waiting for them, and `gpu-efficiency restore` brings an owner back;
under ``reclaimWhen: OnPressure`` only what a waiting pod needs is reclaimed, and only then.

The scenario files ``procedural/owner-reclaim.yaml``, ``procedural/reclaim-on-pressure.yaml`` and
``procedural/owner-lifecycle.yaml`` set the stage and check the owners' fields and events; these tests
add the HorizontalPodAutoscaler (whose target is scaled like any other), the waiting 2-GPU pod, the restore command, a Kubeflow-style
Notebook (a minimal CRD; the test plays its controller), per-pod activity switched by annotating a
pod, and a crash of the operator mid-warning, and print the time from the reclaim to the waiting pod
running (for the issue's note).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
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
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

SCENARIO_LABEL = "sim.gpuefficiency.io/scenario"
T = TypeVar("T")


def waiting_pod(name: str, scenario: str, node: str | None = None) -> dict[str, Any]:
    """A 2-GPU pod for the scenario's nodes (or only ``node``): they are full, so it waits until
    GPUs are reclaimed."""
    selector = {SCENARIO_LABEL: scenario} | ({"kubernetes.io/hostname": node} if node else {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": selector,
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


def _wait_until_scheduled(core: client.CoreV1Api, namespaces: list[str], timeout: float = 90.0) -> None:
    """Until every pod the scenario submitted is bound to a node, and their number held for two
    polls: t=0 means submitted, and a waiting pod created before the controllers made theirs could
    take a GPU the scenario's pods were meant to fill (the precondition below)."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        pods = [p for ns in namespaces for p in core.list_namespaced_pod(ns).items]
        bound = sum(1 for p in pods if p.spec.node_name)
        if pods and bound == len(pods) and bound == last:
            return
        last = bound if bound == len(pods) else -1
        time.sleep(2)
    raise AssertionError(f"the scenario's pods were not all scheduled within {timeout:.0f} s")


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
        _wait_until_scheduled(core, list(bg.run.namespaces.values()))
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


def _unschedulable_for_gpus(pod: client.V1Pod) -> str:
    """The scheduler's message when the pod waits Pending as unschedulable for lack of GPUs, else ''."""
    scheduled = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
    if (
        pod.status.phase == "Pending"
        and scheduled is not None
        and scheduled.status == "False"
        and scheduled.reason == "Unschedulable"
        and names.GPU_RESOURCE in (scheduled.message or "")
    ):
        return str(scheduled.message)
    return ""


def _until(
    bg: BackgroundScenario, probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5
) -> T:
    """wait_for, with the scenario's lines so far in the failure."""
    try:
        return wait_for(probe, timeout, interval=interval, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bg.report()}") from None


def test_on_pressure_reclaims_only_what_the_waiting_pod_needs(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy, on_a, on_b = "pressure-reclaim", ("nb-a1", "nb-a2"), "nb-b"
    seen: dict[str, Any] = {}

    with BackgroundScenario("reclaim-on-pressure", cluster, operator_identity, tmp_path) as bg:
        ns = bg.namespace("sim-pressure")
        node_a = bg.run.names.nodes["pressure-gpu-a"]

        def status() -> dict[str, Any]:
            obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
            return dict(obj.get("status") or {})

        def replicas(name: str) -> int:
            return int(apps.read_namespaced_deployment(name, ns).spec.replicas)

        def current_pods(name: str) -> list[client.V1Pod]:
            pods = core.list_namespaced_pod(ns, label_selector=f"{WORKLOAD_LABEL}={name}").items
            return [p for p in pods if p.metadata.deletion_timestamp is None]

        def evict_after() -> dict[str, float]:
            """evict-after of each workload's one current pod (missing ones left out)."""
            out = {}
            for name in (*on_a, on_b):
                pods = current_pods(name)
                stamp = (
                    parse_rfc3339((pods[0].metadata.annotations or {}).get(names.EVICT_AFTER))
                    if pods
                    else None
                )
                if len(pods) == 1 and stamp is not None:
                    out[name] = stamp
            return out

        # (2) The warnings go out and fall due (a cycle past the last evict-after), and at t >= 60s
        # nothing is reclaimed: nothing waits for GPUs.
        def all_due() -> dict[str, float] | None:
            found = evict_after()
            return found if len(found) == 3 and max(found.values()) + 5 < time.time() else None

        due = _until(bg, all_due, 150, interval=1, what="the three warnings due")
        bg.sleep_until(60)
        assert evict_after().keys() == due.keys(), "a warning was withdrawn while nothing waited"
        assert {name: replicas(name) for name in (*on_a, on_b)} == dict.fromkeys((*on_a, on_b), 1)
        before = status()
        assert before.get("reclaimsTotal") == 0, before
        assert (before.get("pendingGpuDemand") or {}).get("gpus") == 0, before
        seen["created_at"] = bg.elapsed()

        # (3) A 2-GPU pod for pressure-gpu-a only: the node is full, so it waits for GPUs.
        core.create_namespaced_pod(ns, waiting_pod("waiting", bg.run.name, node=node_a))

        def waiting() -> client.V1Pod:
            try:
                return core.read_namespaced_pod("waiting", ns)
            except client.exceptions.ApiException as exc:
                raise AssertionError(f"the waiting pod: HTTP {exc.status}\n{bg.report()}") from exc

        seen["message"] = _until(
            bg,
            lambda: _unschedulable_for_gpus(waiting()),
            60,
            what="the 2-GPU pod Pending as unschedulable for lack of nvidia.com/gpu",
        )

        # (4) Exactly the two Deployments on pressure-gpu-a are scaled to zero; nb-b is untouched
        # (the scenario holds it to the end).
        _until(
            bg,
            lambda: all(replicas(name) == 0 for name in on_a),
            90,
            what=f"{' and '.join(on_a)} scaled to zero",
        )
        assert replicas(on_b) == 1
        seen["reclaimed_at"] = bg.elapsed()

        # (5) The waiting pod runs on the freed GPUs of pressure-gpu-a ...
        running = _until(
            bg,
            lambda: (p := waiting()).status.phase == "Running" and p,
            120,
            what="the waiting 2-GPU pod Running on reclaimed GPUs",
        )
        assert running.spec.node_name == node_a
        seen["running_at"] = bg.elapsed()
        # ... and in the next three cycles (interval 5s) nothing else is reclaimed and no replacement
        # pod appears. (lastEvaluationTime cannot count cycles: a status whose only change is that
        # stamp waits for the refresh, so a steady policy costs no write per cycle.)
        until = bg.elapsed() + 3 * 5 + 2
        while bg.elapsed() < until:
            now = status()
            assert now.get("reclaimsTotal") == 2, now
            time.sleep(1)
        assert not [p.metadata.name for name in on_a for p in current_pods(name)]
        assert replicas(on_b) == 1
        assert len(current_pods(on_b)) == 1

        # (6) The records name the waiting pod and give the time from the action to it running.
        def timed() -> list[dict[str, Any]]:
            records = [
                r
                for r in status().get("reclamations") or []
                if f"{ns}/waiting" in (r.get("waitingPods") or [])
            ]
            return records if any(r.get("secondsToRunning") is not None for r in records) else []

        records = _until(bg, timed, 60, interval=1, what="secondsToRunning in status.reclamations")
        assert {r["owner"] for r in records} == {f"{ns}/Deployment/{name}" for name in on_a}, records
        assert all(r.get("nodes") == [node_a] for r in records), records
        seen["seconds_to_running"] = [r.get("secondsToRunning") for r in records]
        seen["gpu_hours_returned"] = status().get("gpuHoursReturned")
        assert (seen["gpu_hours_returned"] or 0) > 0, status()
    result = bg.finish()
    print(
        f"\nOnPressure: pod created t={seen['created_at']:.0f}s ({seen['message'][:120]}), "
        f"owners scaled to zero by t={seen['reclaimed_at']:.0f}s, pod Running on {node_a} by "
        f"t={seen['running_at']:.0f}s; secondsToRunning per record {seen['seconds_to_running']}; "
        f"gpuHoursReturned {seen['gpu_hours_returned']}"
    )
    assert result.passed, bg.report()


# ---- a Kubeflow-style Notebook, partly idle and woken owners, a crash mid-warning ----------------

NOTEBOOK_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "notebooks.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "names": {
            "kind": "Notebook",
            "plural": "notebooks",
            "singular": "notebook",
            "listKind": "NotebookList",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
                "subresources": {"status": {}},
            }
        ],
    },
}


def install_notebook_crd(k8s: client.ApiClient) -> None:
    """The minimal Notebook CRD (kubeflow.org/v1), Established; one already there is kept."""
    ext = client.ApiextensionsV1Api(k8s)
    try:
        ext.create_custom_resource_definition(NOTEBOOK_CRD)
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(NOTEBOOK_CRD["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, 60, what="the Notebook CRD Established")


def notebook_pod_template(scenario: str, node: str) -> dict[str, Any]:
    """A 1-GPU notebook pod for the node that the simulator plays idle."""
    pod = waiting_pod("notebook", scenario, node)
    pod["spec"]["containers"][0]["resources"] = {"limits": {names.GPU_RESOURCE: "1"}}
    return {
        "metadata": {"labels": {"notebook-name": "lab"}, "annotations": {PROFILE_ANNOTATION: "idle"}},
        "spec": pod["spec"],
    }


def play_notebook_controller(
    k8s: client.ApiClient, namespace: str, notebook: dict[str, Any], template: dict[str, Any]
) -> None:
    """What the Kubeflow notebook controller does for a new Notebook: a StatefulSet of one replica,
    named like it and controlled by it."""
    meta = notebook["metadata"]
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    client.AppsV1Api(k8s).create_namespaced_stateful_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": meta["name"], "ownerReferences": [owner]},
            "spec": {
                "replicas": 1,
                "serviceName": "",
                "selector": {"matchLabels": template["metadata"]["labels"]},
                "template": template,
            },
        },
    )


def event_count(core: client.CoreV1Api, namespace: str, kind: str, name: str, reason: str) -> int:
    """How many times the event was emitted (repeats of one event are counted in it)."""
    events = core.list_namespaced_event(
        namespace,
        field_selector=f"reason={reason},involvedObject.kind={kind},involvedObject.name={name}",
    ).items
    return sum(e.count or 1 for e in events)


def test_notebook_stopped_busy_shared_partly_idle_owners_kept_and_a_crash_mid_warning_acts_once(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy = "owner-lifecycle"
    seen: dict[str, Any] = {}
    install_notebook_crd(k8s)  # before the operator starts: its discovery finds the integration

    with BackgroundScenario("owner-lifecycle", cluster, operator_identity, tmp_path) as bg:
        ns, shared_ns = bg.namespace("sim-life"), bg.namespace("sim-shared")

        def pods_of(workload: str) -> list[client.V1Pod]:
            found = core.list_namespaced_pod(ns, label_selector=f"{WORKLOAD_LABEL}={workload}").items
            return [p for p in found if p.metadata.deletion_timestamp is None]

        def set_profile(pod: client.V1Pod, profile: str) -> None:
            body = {"metadata": {"annotations": {PROFILE_ANNOTATION: profile}}}
            core.patch_namespaced_pod(pod.metadata.name, ns, body)

        def notebook() -> dict[str, Any]:
            obj: Any = custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "notebooks", "lab")
            return dict(obj)

        def status() -> dict[str, Any]:
            obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
            return dict(obj.get("status") or {})

        # The Notebook, and its controller's StatefulSet; one replica of `partial` busy.
        template = notebook_pod_template(bg.run.name, bg.run.names.nodes["life-gpu-0"])
        created: Any = custom.create_namespaced_custom_object(
            "kubeflow.org",
            "v1",
            ns,
            "notebooks",
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Notebook",
                "metadata": {"name": "lab"},
                "spec": {"template": {"spec": template["spec"]}},
            },
        )
        play_notebook_controller(k8s, ns, created, template)
        partial = _until(bg, lambda: len(p := pods_of("partial")) == 3 and p, 60, what="3 pods of partial")
        set_profile(sorted(partial, key=lambda p: p.metadata.name)[0], "compute-bound")

        # (1) The warnings go out; `waker` turns busy during its warning.
        def warned(workload: str) -> tuple[str, float] | None:
            pods = pods_of(workload)
            stamp = (
                parse_rfc3339((pods[0].metadata.annotations or {}).get(names.EVICT_AFTER)) if pods else None
            )
            return (pods[0].metadata.name, stamp) if stamp is not None else None

        sleeper_pod, deadline = _until(bg, lambda: warned("sleeper"), 90, what="the warning of sleeper")
        waker_pod, _ = _until(bg, lambda: warned("waker"), 30, what="the warning of waker")
        set_profile(core.read_namespaced_pod(waker_pod, ns), "compute-bound")

        # (2) A crash mid-warning (SIGKILL: its lease runs out, nothing is released) and a restart.
        assert time.time() < deadline - 20, (
            f"warned too late to crash mid-warning ({deadline - time.time():.0f}s left)"
        )
        bg.run.restart_operator()
        seen["crash_before_deadline_s"] = deadline - time.time()

        # (3) At the original deadline, and not before, `sleeper` is scaled to zero, once.
        def sleeper_replicas() -> int:
            return int(apps.read_namespaced_deployment("sleeper", ns).spec.replicas)

        while time.time() < deadline - 1:
            assert sleeper_replicas() == 1, "scaled before the deadline of its warning"
            after = (core.read_namespaced_pod(sleeper_pod, ns).metadata.annotations or {}).get(
                names.EVICT_AFTER
            )
            assert parse_rfc3339(after) == deadline, f"the restarted operator moved the deadline: {after}"
            time.sleep(1)
        _until(bg, lambda: sleeper_replicas() == 0, 60, what="sleeper scaled to zero")
        reclaimed = apps.read_namespaced_deployment("sleeper", ns).metadata.annotations or {}
        at = parse_rfc3339(reclaimed.get(names.RECLAIMED_AT))
        assert at is not None, reclaimed
        assert at >= deadline, f"acted at {at}, before the deadline {deadline}"
        # the first cycle past it (interval 5s, the cycle's view of time a few seconds behind), not
        # a warning given again by the restarted operator (40s later)
        assert at <= deadline + 15, f"acted at {at}, {at - deadline:.0f}s after the deadline {deadline}"
        seen["acted_after_deadline_s"] = at - deadline
        seen["scaled_at"] = bg.elapsed()

        # (4) The Notebook is stopped; its controller (played here) takes the StatefulSet to zero.
        stopped = _until(
            bg,
            lambda: names.KUBEFLOW_STOPPED in ((a := notebook()["metadata"].get("annotations")) or {}) and a,
            60,
            what="the Notebook stopped (kubeflow-resource-stopped)",
        )
        assert stopped.get(names.RECLAIMED) == "Stop", stopped
        apps.patch_namespaced_stateful_set_scale("lab", ns, {"spec": {"replicas": 0}})
        _until(
            bg,
            lambda: (
                not [h for hs in bg.run.sim.holders().values() for h in hs if h.pod.name.startswith("lab-")]
            ),
            60,
            what="the notebook's GPU free",
        )

        # (5) Three more cycles: each owner acted on once, the others left alone.
        until = time.time() + 3 * 5 + 2
        while time.time() < until:
            assert status().get("reclaimsTotal") == 3, status()
            time.sleep(1)
        counts = {
            "sleeper": event_count(core, ns, "Deployment", "sleeper", names.EV_RECLAIMED),
            "notebook": event_count(core, ns, "Notebook", "lab", names.EV_RECLAIMED),
            "sleeper warned": event_count(core, ns, "Pod", sleeper_pod, names.EV_EVICTION_SCHEDULED),
            "waker": event_count(core, ns, "Deployment", "waker", names.EV_RECLAIMED),
            "partial": event_count(core, ns, "Deployment", "partial", names.EV_RECLAIMED),
            "twin": event_count(core, shared_ns, "Deployment", "twin", names.EV_RECLAIMED),
            "shared-idle": event_count(core, shared_ns, "Deployment", "shared-idle", names.EV_RECLAIMED),
        }
        assert counts == {
            "sleeper": 1,
            "notebook": 1,
            "sleeper warned": 1,
            "waker": 0,
            "partial": 0,
            "twin": 1,
            "shared-idle": 0,
        }, counts
        # Time-sliced GPUs: the two replicas of `twin` shared one GPU, freed once; `shared-idle`
        # shares a GPU with a busy pod, so it is not even idle.
        twin = [r for r in status().get("reclamations") or [] if r["owner"] == f"{shared_ns}/Deployment/twin"]
        assert [r["gpus"] for r in twin] == [1], twin
        (sharing,) = [
            p for p in core.list_namespaced_pod(shared_ns).items if p.metadata.name.startswith("shared-idle-")
        ]
        assert (sharing.metadata.annotations or {}).get(names.STATE) != "Idle", sharing.metadata.annotations
        waker = core.read_namespaced_pod(waker_pod, ns)
        assert waker.metadata.deletion_timestamp is None
        assert names.EVICT_AFTER not in (waker.metadata.annotations or {}), "the busy owner is still warned"
        assert apps.read_namespaced_deployment("partial", ns).spec.replicas == 3

        # (6) The way back for the Notebook: the annotation goes, its controller would start it.
        restored = cli(cluster, "restore", "notebook/lab", "-n", ns)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        left = notebook()["metadata"].get("annotations") or {}
        assert not ({names.KUBEFLOW_STOPPED, *names.OWNER_ANNOTATIONS} & set(left)), left
        seen["checked_at"] = bg.elapsed()
    result = bg.finish()
    print(
        f"\ncrash {seen['crash_before_deadline_s']:.0f}s before the deadline; "
        f"sleeper scaled {seen['acted_after_deadline_s']:.1f}s after it (t={seen['scaled_at']:.0f}s); "
        f"checks done by t={seen['checked_at']:.0f}s"
    )
    assert result.passed, bg.report()
