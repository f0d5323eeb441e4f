"""Idle reclamation steps the scenario format cannot express (issue 3), on the real local cluster.

Each test runs a scenario of ``scenarios/procedural/`` in the background (nodes, simulator, policy,
the operator as a process with the chart's RBAC) and observes or acts meanwhile: it follows the
eviction count cycle by cycle, or adds a DaemonSet. The other idle stories (eviction and the fresh
clock of the replacement, activity, safety filters, missing metrics, Observe, diagnoses) are
scenario files run by test_scenarios.py.
"""

from __future__ import annotations

import itertools
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


def test_budgets_cap_evictions_per_cycle_and_per_namespace(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    policy = "eviction-budgets"
    totals: list[tuple[float, int]] = []  # (scenario time, status.evictionsTotal)
    evicted_events: list[client.CoreV1Event] = []
    status: dict[str, Any] = {}
    bg_ref: list[BackgroundScenario] = []
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            try:
                obj = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
                totals.append((bg_ref[0].elapsed(), int((obj.get("status") or {}).get("evictionsTotal", 0))))
            except client.exceptions.ApiException:
                pass
            time.sleep(0.4)

    def before_teardown() -> None:
        bg = bg_ref[0]
        for ns in (bg.namespace("sim-budget-a"), bg.namespace("sim-budget-b")):
            evicted_events.extend(
                core.list_namespaced_event(ns, field_selector="reason=GPUIdleEvicted").items
            )
        status.update(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy).get("status") or {})

    bg = BackgroundScenario("eviction-budgets", cluster, operator_identity, tmp_path, before_teardown)
    bg_ref.append(bg)
    follower = threading.Thread(target=follow, daemon=True)
    with bg:
        follower.start()
        result = bg.finish()
    stop.set()
    follower.join(5)
    assert result.passed, bg.report()

    # Per cycle, from the status the operator writes: it never grew by more than maxPerCycle (2)
    # between two reads 0.4 s apart (cycles are 5 s apart), and reached 6 over at least 4 steps.
    steps = [(t, b - a) for (_, a), (t, b) in itertools.pairwise(totals) if b != a]
    assert totals, "the policy status was never read"
    assert totals[-1][1] == 6, totals[-5:]
    assert all(0 < d <= 2 for _, d in steps), f"evictionsTotal steps (scenario time, increase): {steps}"
    assert len(steps) >= 4, f"sim-budget-a alone needs 4 cycles at 1 per namespace per cycle: {steps}"
    # recentEvictions records every eviction with its cycle's time: at most 2 share one.
    per_cycle = Counter(status.get("recentEvictions") or [])
    assert sum(per_cycle.values()) == 6, per_cycle
    assert max(per_cycle.values()) <= 2, per_cycle

    # Per namespace per cycle, from the GPUIdleEvicted events (one per evicted pod).
    evictions = [(_when(e), e.involved_object.namespace, e.involved_object.name) for e in evicted_events]
    assert len(evictions) == 6, evictions
    cycles = _cycles(evictions, gap=2.5)
    assert len(cycles) == len(per_cycle), (cycles, per_cycle)
    for cycle in cycles:
        namespaces = Counter(ns for _, ns, _ in cycle)
        assert len(cycle) <= 2, f"one cycle evicted {cycle}"
        assert max(namespaces.values()) == 1, f"one cycle evicted {cycle}"


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
