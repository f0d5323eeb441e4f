"""Idle reclamation steps the scenario format cannot express (issue 3), on the real local cluster.

Each test runs a scenario of ``scenarios/procedural/`` in the background (nodes, simulator, policy,
the operator as a process with the chart's RBAC) and observes or acts meanwhile: it follows the
eviction count cycle by cycle, or adds a DaemonSet. The other idle stories (eviction and the fresh
clock of the replacement, activity, safety filters, missing metrics, Observe, diagnoses) are
scenario files run by test_scenarios.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from tests.e2e.harness import Cluster, OperatorIdentity, wait_for
from tests.e2e.scenario_driver import BackgroundScenario
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

SCENARIO_LABEL = "sim.gpuefficiency.io/scenario"


def _when(event: client.CoreV1Event) -> float:
    stamp: datetime | None = event.first_timestamp or event.event_time or event.metadata.creation_timestamp
    assert stamp is not None
    return stamp.timestamp()


def _cycles(times: list[tuple[float, str, str]], gap: float) -> list[list[tuple[float, str, str]]]:
    """Group (time, namespace, pod) by cycle: events of one cycle are written within a second; cycles
    are an interval (5s) apart."""
    groups: list[list[tuple[float, str, str]]] = []
    for item in sorted(times):
        if groups and item[0] - groups[-1][-1][0] < gap:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


#: The owners of eviction-budgets.yaml: (namespace, kind/name) -> GPU pods. Each is one action.
BUDGET_OWNERS = {
    ("sim-budget-a", "deployment/a-notebook"): 2,
    ("sim-budget-a", "job/a-batch"): 1,
    ("sim-budget-a", "pod/a-0"): 1,
    ("sim-budget-a", "pod/a-1"): 1,
    ("sim-budget-b", "deployment/b-notebook"): 1,
    ("sim-budget-b", "job/b-batch"): 1,
    ("sim-budget-b", "pod/b-0"): 1,
}
MAX_PER_CYCLE, MAX_PER_NAMESPACE, MAX_PER_HOUR, INTERVAL_S = 3, 2, 5, 5.0


def test_budgets_cap_reclaims_per_cycle_namespace_and_hour_counting_owners(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy = "eviction-budgets"
    totals: list[tuple[float, int]] = []  # (scenario time, status.reclaimsTotal + evictionsTotal)
    events: list[client.CoreV1Event] = []
    pods: list[client.V1Pod] = []
    status: dict[str, Any] = {}
    end: list[float] = []
    dry_run: dict[str, Any] = {}  # `gpu-efficiency report --policy eviction-budgets -o json`
    bg_ref: list[BackgroundScenario] = []
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            try:
                st = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy).get("status") or {}
                acted = int(st.get("reclaimsTotal", 0)) + int(st.get("evictionsTotal", 0))
                totals.append((bg_ref[0].elapsed(), acted))
            except client.exceptions.ApiException:
                pass
            time.sleep(0.4)

    def before_teardown() -> None:
        bg = bg_ref[0]
        end.append(time.time())
        for ns in (bg.namespace("sim-budget-a"), bg.namespace("sim-budget-b")):
            for reason in ("GPUReclaimed", "GPUIdleEvicted"):
                events.extend(core.list_namespaced_event(ns, field_selector=f"reason={reason}").items)
            pods.extend(core.list_namespaced_pod(ns).items)
        status.update(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy).get("status") or {})
        # what an admin asks: why are these due owners still here?
        found = cli(
            cluster, "report", "--policy", policy, "--prometheus-url", cluster.prometheus_url, "-o", "json"
        )
        dry_run.update(json.loads(found.stdout) if found.returncode == 0 else {"error": found.stderr})

    bg = BackgroundScenario(policy, cluster, operator_identity, tmp_path, before_teardown)
    bg_ref.append(bg)
    follower = threading.Thread(target=follow, daemon=True)
    with bg:
        follower.start()
        result = bg.finish()
        scenario_ns = {bg.namespace(n): n for n in ("sim-budget-a", "sim-budget-b")}
    stop.set()
    follower.join(5)
    assert result.passed, bg.report()

    # The actions, one per owner: GPUReclaimed on a Deployment or Job itself (its pods get one each
    # too, not counted), GPUIdleEvicted on a bare pod.
    actions = [
        (_when(e), scenario_ns[e.involved_object.namespace], f"{e.involved_object.kind.lower()}/{name}")
        for e in events
        if (e.reason == "GPUIdleEvicted") == (e.involved_object.kind == "Pod")
        for name in [e.involved_object.name]
    ]
    acted = Counter((ns, who) for _, ns, who in actions)
    assert set(acted) <= set(BUDGET_OWNERS), actions
    assert max(acted.values()) == 1, f"an owner acted on twice: {acted}"
    assert len(acted) == MAX_PER_HOUR, f"the hour's budget is {MAX_PER_HOUR} owners: {sorted(acted)}"

    # Each owner counts once however many pods it has: the 2-replica Deployment is one action.
    assert ("sim-budget-a", "deployment/a-notebook") in acted, sorted(acted)
    freed = sum(BUDGET_OWNERS[owner] for owner in acted)
    assert freed == MAX_PER_HOUR + 1, (freed, sorted(acted))
    per_cycle = Counter(status.get("recentEvictions") or [])
    assert sum(per_cycle.values()) == MAX_PER_HOUR, per_cycle
    assert status.get("reclaimsTotal", 0) + status.get("evictionsTotal", 0) == MAX_PER_HOUR, status

    # Per cycle, from the status the operator writes (read every 0.4 s, cycles 5 s apart) and its
    # record of the hour: never more than maxPerCycle actions at once.
    steps = [(t, b - a) for (_, a), (t, b) in itertools.pairwise(totals) if b != a]
    assert totals, "the policy status was never read"
    assert totals[-1][1] == MAX_PER_HOUR, totals[-5:]
    assert all(0 < d <= MAX_PER_CYCLE for _, d in steps), f"(scenario time, actions) per step: {steps}"
    assert max(per_cycle.values()) <= MAX_PER_CYCLE, per_cycle

    # Per namespace per cycle, from the events (written within a second of their cycle).
    cycles = _cycles(actions, gap=2.5)
    assert len(cycles) == len(per_cycle), (cycles, per_cycle)
    for cycle in cycles:
        assert len(cycle) <= MAX_PER_CYCLE, f"one cycle acted on {cycle}"
        assert max(Counter(ns for _, ns, _ in cycle).values()) <= MAX_PER_NAMESPACE, (
            f"one cycle acted on {cycle}"
        )

    # Per hour: the total stopped at maxPerHour for at least three cycles after, while the two
    # owners left were due all along: still warned, past their evict-after, and untouched.
    reached = next(t for t, n in totals if n == MAX_PER_HOUR)
    assert totals[-1][0] - reached >= 3 * INTERVAL_S, (reached, totals[-1])
    held = set(BUDGET_OWNERS) - set(acted)
    left: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        meta = pod.metadata
        workload = (meta.labels or {}).get("sim.gpuefficiency.io/workload", "")
        owner = next(
            (o for o in held if o[0] == scenario_ns[meta.namespace] and o[1].endswith(f"/{workload}")), None
        )
        if owner is None or meta.deletion_timestamp is not None:
            continue
        left[owner] += 1
        due = (meta.annotations or {}).get("gpuefficiency.io/evict-after")
        assert due is not None, f"{meta.name} of {owner} is no longer warned"
        waited = end[0] - datetime.fromisoformat(due).timestamp()
        assert waited >= 2 * INTERVAL_S, f"{meta.name} was due only {waited:.0f}s before the end"
    assert left == {owner: BUDGET_OWNERS[owner] for owner in held}, (left, held)
    assert status.get("warnedPods") == sum(left.values()), status.get("warnedPods")
    # ... and `gpu-efficiency report --policy` says that the hour's budget holds them, not what it
    # would do to them: it counts the budget from the policy's status, as the operator does.
    assert "error" not in dry_run, dry_run["error"]
    real_ns = {v: k for k, v in scenario_ns.items()}
    for ns, who in held:
        note = f"{real_ns[ns]}/{who}: reclaim postponed: maxPerHour {MAX_PER_HOUR} reached"
        assert any(n.startswith(note) for n in dry_run["notes"]), (note, dry_run["notes"])
    ours = [a for a in dry_run["actions"] if a["pod"].split("/")[0] in scenario_ns]
    assert ours == [], ours


def idle_gpu_daemonset(name: str, scenario: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {"sim.gpuefficiency.io/profile": "idle"},
                },
                "spec": {
                    "nodeSelector": {SCENARIO_LABEL: scenario},
                    "tolerations": [
                        {
                            "key": SCENARIO_LABEL,
                            "operator": "Equal",
                            "value": scenario,
                            "effect": "NoSchedule",
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "agent",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def test_idle_daemonset_pods_are_judged_but_never_warned_or_evicted(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    with BackgroundScenario("daemonset-idle", cluster, operator_identity, tmp_path) as bg:
        ns = bg.namespace("sim-daemonset")
        client.AppsV1Api(k8s).create_namespaced_daemon_set(ns, idle_gpu_daemonset("gpu-agent", bg.run.name))

        def ds_pods() -> list[client.V1Pod]:
            return list(core.list_namespaced_pod(ns, label_selector="app=gpu-agent").items)

        pods = wait_for(
            lambda: (p := ds_pods()) and len(p) == 2 and all(x.status.phase == "Running" for x in p) and p,
            60,
            what="two DaemonSet pods Running",
        )
        uids = {p.metadata.uid for p in pods}

        def judged_idle() -> bool:
            return all(
                (p.metadata.annotations or {}).get("gpuefficiency.io/state") == "Idle" for p in ds_pods()
            )

        wait_for(judged_idle, 60, what="the DaemonSet pods judged Idle")
        while bg.elapsed() < 78:  # the control Deployment is warned and scaled to zero meanwhile
            now = ds_pods()
            assert {p.metadata.uid for p in now} == uids, "a DaemonSet pod was evicted"
            for p in now:
                annotations = p.metadata.annotations or {}
                assert not p.metadata.deletion_timestamp, f"{p.metadata.name} is being deleted"
                assert "gpuefficiency.io/evict-after" not in annotations, f"{p.metadata.name} was warned"
                assert annotations.get("gpuefficiency.io/state") == "Idle", annotations
            time.sleep(1)
        events = {
            e.reason
            for p in pods
            for e in core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={p.metadata.name}"
            ).items
        }
        assert "GPUIdle" in events, events
        assert not events & {"GPUIdleEvictionScheduled", "GPUIdleEvicted"}, events
    result = bg.finish()
    assert result.passed, bg.report()
