"""Expectations: pod histories, each check against observations, deadlines and holds."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_efficiency_sim.expectations import Names, Tracker, check, describe
from gpu_efficiency_sim.observation import Observation, WorkloadHistory, update_histories
from gpu_efficiency_sim.scenario import Expectation, parse_scenario

SCENARIO = parse_scenario(
    """
nodes: [{name: n0}]
workloads: [{name: w, namespace: ns}]
policies: {p: {}}
"""
).scenario
NAMES = Names(workloads={"w": ("pre-ns", "w")}, nodes={"n0": "n0"})


def expectation(**fields: Any) -> Expectation:
    return Expectation.model_validate(fields)


def pod(
    name: str,
    uid: str,
    *,
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "pre-ns",
        "uid": uid,
        "labels": {"sim.gpuefficiency.io/workload": "w"},
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "conditions": conditions or []}}


def histories() -> dict[tuple[str, str], WorkloadHistory]:
    return {("pre-ns", "w"): WorkloadHistory("pre-ns", "w")}


def test_eviction_is_seen_as_termination_or_disappearance_and_replacements_are_not_original() -> None:
    h = histories()
    update_histories(h, [pod("w-a", "a")], 1.0)
    evicted = pod(
        "w-a",
        "a",
        deleting=True,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
    )
    update_histories(h, [evicted, pod("w-b", "b")], 2.0)
    update_histories(h, [pod("w-b", "b")], 3.0)
    record = h[("pre-ns", "w")].pods
    assert record["a"].evicted_at == 2.0
    assert "EvictionByEvictionAPI" in record["a"].how
    assert record["a"].original
    assert not record["b"].original
    assert record["b"].evicted_at is None


def test_a_pod_that_vanishes_between_polls_counts_as_evicted() -> None:
    h = histories()
    update_histories(h, [pod("w-a", "a")], 1.0)
    update_histories(h, [], 2.0)
    assert h[("pre-ns", "w")].pods["a"].how == "deleted"


def test_pod_evicted_and_not_evicted() -> None:
    h = histories()
    update_histories(h, [pod("w-a", "a")], 1.0)
    obs = Observation(t=1.0)
    evicted = expectation(within="60s", podEvicted={"workload": "w"})
    kept = expectation(within="60s", podNotEvicted={"workload": "w"})
    assert not check(evicted, obs, NAMES, h).ok
    assert check(kept, obs, NAMES, h).ok
    update_histories(h, [], 5.0)
    verdict = check(evicted, Observation(t=5.0), NAMES, h)
    assert verdict.ok
    assert "pod pre-ns/w-a evicted at 5.0s (deleted)" in verdict.observed
    assert not check(kept, Observation(t=5.0), NAMES, h).ok
    later = expectation(within="60s", after="10s", podNotEvicted={"workload": "w"})
    assert check(later, Observation(t=11.0), NAMES, h).ok, "evictions before `after` do not count"


def test_pod_annotation_tests_on_current_pods() -> None:
    obs = Observation(
        t=1.0,
        pods=[
            pod("w-old", "o", deleting=True, annotations={"k": "Idle"}),
            pod("w-a", "a", annotations={"k": "Efficient"}),
        ],
    )
    h = histories()
    assert check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "equals": "Efficient"}),
        obs,
        NAMES,
        h,
    ).ok
    assert not check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "equals": "Idle"}), obs, NAMES, h
    ).ok
    assert check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "notEquals": "Idle"}),
        obs,
        NAMES,
        h,
    ).ok
    assert check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "oneOf": ["A", "Efficient"]}),
        obs,
        NAMES,
        h,
    ).ok
    assert check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "z", "exists": False}), obs, NAMES, h
    ).ok
    verdict = check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "z", "exists": True}), obs, NAMES, h
    )
    assert not verdict.ok
    assert verdict.observed == "pre-ns/w-a: no z"
    assert not check(
        expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "exists": True}),
        Observation(t=1.0),
        NAMES,
        h,
    ).ok


def test_events_on_pods_nodes_and_policies() -> None:
    h = histories()
    update_histories(h, [pod("w-a", "a")], 1.0)
    events = [
        {
            "reason": "GPUIdle",
            "type": "Normal",
            "message": "idle for 10m",
            "involvedObject": {"kind": "Pod", "namespace": "pre-ns", "name": "w-a"},
        },
        {
            "reason": "NodeTainted",
            "type": "Warning",
            "message": "ecc",
            "involvedObject": {"kind": "Node", "name": "n0"},
        },
        {
            "reason": "PolicyInvalid",
            "type": "Warning",
            "message": "x",
            "involvedObject": {"kind": "GPUEfficiencyPolicy", "name": "p"},
        },
    ]
    obs = Observation(t=1.0, events=events)
    assert check(expectation(within="9s", event={"workload": "w", "reason": "GPUIdle"}), obs, NAMES, h).ok
    assert check(
        expectation(within="9s", event={"workload": "w", "reason": "GPUIdle", "messageContains": "10m"}),
        obs,
        NAMES,
        h,
    ).ok
    assert not check(
        expectation(within="9s", event={"workload": "w", "reason": "GPUIdle", "type": "Warning"}),
        obs,
        NAMES,
        h,
    ).ok
    assert check(expectation(within="9s", event={"node": "n0", "reason": "NodeTainted"}), obs, NAMES, h).ok
    assert check(expectation(within="9s", event={"policy": "p", "reason": "PolicyInvalid"}), obs, NAMES, h).ok
    missing = check(
        expectation(within="9s", event={"node": "n0", "reason": "GPUFaultDetected"}), obs, NAMES, h
    )
    assert not missing.ok
    assert "reasons seen: NodeTainted" in missing.observed
    assert check(
        expectation(within="9s", event={"node": "n0", "reason": "Nope", "absent": True}), obs, NAMES, h
    ).ok


def test_annotation_contains_every_part_and_owner_events_are_the_objects_own() -> None:
    obs = Observation(t=1.0, pods=[pod("w-a", "a", annotations={"k": "GPU 5 on n1; cause: thermal"})])
    h = histories()
    update_histories(h, obs.pods, 1.0)

    def contains(*parts: str) -> bool:
        e = expectation(within="9s", podAnnotation={"workload": "w", "key": "k", "contains": list(parts)})
        return check(e, obs, NAMES, h).ok

    assert contains("GPU 5", "cause: thermal")
    assert not contains("GPU 5", "cause: power")
    with pytest.raises(ValueError, match="exactly one of"):
        expectation(
            within="9s", podAnnotation={"workload": "w", "key": "k", "contains": ["x"], "exists": True}
        )
    on_pod = {
        "reason": "GPUStraggler",
        "involvedObject": {"kind": "Pod", "namespace": "pre-ns", "name": "w-a"},
    }
    on_job = {"reason": "GPUStraggler", "involvedObject": {"kind": "Job", "namespace": "pre-ns", "name": "w"}}
    owner = expectation(within="9s", event={"workload": "w", "owner": True, "reason": "GPUStraggler"})
    assert not check(owner, Observation(t=1.0, events=[on_pod]), NAMES, h).ok
    assert check(owner, Observation(t=1.0, events=[on_job]), NAMES, h).ok
    pods = expectation(within="9s", event={"workload": "w", "reason": "GPUStraggler"})
    assert not check(pods, Observation(t=1.0, events=[on_job]), NAMES, h).ok
    with pytest.raises(ValueError, match="owner applies"):
        expectation(within="9s", event={"node": "n0", "owner": True, "reason": "x"})


def test_taints_and_conditions() -> None:
    node = {
        "spec": {"taints": [{"key": "gpuefficiency.io/gpu-fault", "value": "ecc", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "GPUHealthy", "status": "False", "reason": "EccError"}]},
    }
    obs = Observation(t=1.0, nodes={"n0": node})
    h = histories()
    assert check(expectation(within="9s", nodeTainted={"node": "n0", "value": "ecc"}), obs, NAMES, h).ok
    assert not check(expectation(within="9s", nodeTainted={"node": "n0", "value": "xid"}), obs, NAMES, h).ok
    assert not check(expectation(within="9s", nodeNotTainted={"node": "n0"}), obs, NAMES, h).ok
    assert check(
        expectation(within="9s", nodeNotTainted={"node": "n0", "effect": "NoExecute"}), obs, NAMES, h
    ).ok
    assert check(
        expectation(within="9s", nodeCondition={"node": "n0", "status": "False", "reason": "EccError"}),
        obs,
        NAMES,
        h,
    ).ok
    assert not check(
        expectation(within="9s", nodeCondition={"node": "n0", "status": "True"}), obs, NAMES, h
    ).ok
    assert not check(expectation(within="9s", nodeTainted={"node": "n0"}), Observation(t=1.0), NAMES, h).ok


def test_policy_conditions_and_status_fields() -> None:
    policy = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "evictionsTotal": 2,
            "verdicts": {"idle": 1},
        }
    }
    obs = Observation(t=1.0, policies={"p": policy})
    h = histories()
    assert check(
        expectation(within="9s", policyCondition={"policy": "p", "type": "Ready", "status": "True"}),
        obs,
        NAMES,
        h,
    ).ok
    assert check(
        expectation(within="9s", policyStatus={"policy": "p", "field": "evictionsTotal", "atLeast": 1}),
        obs,
        NAMES,
        h,
    ).ok
    assert check(
        expectation(within="9s", policyStatus={"policy": "p", "field": "verdicts.idle", "equals": 1}),
        obs,
        NAMES,
        h,
    ).ok
    verdict = check(
        expectation(within="9s", policyStatus={"policy": "p", "field": "verdicts.unknown", "exists": True}),
        obs,
        NAMES,
        h,
    )
    assert not verdict.ok
    assert verdict.observed == "status.verdicts.unknown = None"
    assert check(
        expectation(within="9s", policyStatus={"policy": "p", "field": "nope", "exists": False}),
        obs,
        NAMES,
        h,
    ).ok


def test_a_status_list_is_compared_by_its_length() -> None:
    obs = Observation(t=1.0, policies={"p": {"status": {"recentEvictions": ["a", "a", "b"]}}})

    def verdict(**value: Any) -> tuple[bool, str]:
        found = check(
            expectation(within="9s", policyStatus={"policy": "p", "field": "recentEvictions", **value}),
            obs,
            NAMES,
            histories(),
        )
        return found.ok, found.observed

    assert verdict(equals=3) == (True, "len(status.recentEvictions) = 3")
    assert [verdict(atMost=3)[0], verdict(atMost=2)[0]] == [True, False]
    assert [verdict(atLeast=3)[0], verdict(atLeast=4)[0]] == [True, False]
    assert not verdict(equals=2)[0]


def test_promql_checks() -> None:
    series = [({"__name__": "up", "gpu": "0"}, 79.0), ({"__name__": "up", "gpu": "1"}, 0.0)]
    obs = Observation(t=1.0, queries={"q": series, "empty": [], "broken": "bad_data: parse error"})
    h = histories()
    assert check(expectation(within="9s", metric={"query": "q", "equals": 79}), obs, NAMES, h).ok
    assert not check(expectation(within="9s", metric={"query": "q", "atLeast": 80}), obs, NAMES, h).ok
    assert check(expectation(within="9s", metric={"query": "empty", "exists": False}), obs, NAMES, h).ok
    assert not check(expectation(within="9s", metric={"query": "q", "exists": False}), obs, NAMES, h).ok
    broken = check(expectation(within="9s", metric={"query": "broken", "exists": True}), obs, NAMES, h)
    assert not broken.ok
    assert "parse error" in broken.observed


def test_tracker_passes_on_first_success_and_fails_at_the_deadline() -> None:
    h = histories()
    tracker = Tracker(
        [
            expectation(within="10s", nodeTainted={"node": "n0"}),
            expectation(within="10s", nodeNotTainted={"node": "n0"}),
            expectation(within="10s", after="5s", nodeNotTainted={"node": "n0"}),
        ]
    )
    clean = {"n0": {"spec": {}}}
    assert tracker.step(Observation(t=1.0, nodes=clean), NAMES, h) == []
    tainted = {
        "n0": {
            "spec": {
                "taints": [{"key": "gpuefficiency.io/gpu-fault", "value": "ecc", "effect": "NoSchedule"}]
            }
        }
    }
    decided = tracker.step(Observation(t=4.0, nodes=tainted), NAMES, h)
    assert [(o.index, o.passed) for o in decided] == [(0, True), (1, False)], (
        "the taint passes one, breaks the hold"
    )
    assert tracker.step(Observation(t=6.0, nodes=clean), NAMES, h) == []
    decided = tracker.step(Observation(t=10.5, nodes=clean), NAMES, h)
    assert [(o.index, o.passed) for o in decided] == [(2, True)]
    assert not tracker.pending


def test_tracker_fails_late_successes_and_abandons_the_rest() -> None:
    h = histories()
    tracker = Tracker(
        [
            expectation(within="2s", nodeTainted={"node": "n0"}),
            expectation(within="99s", podEvicted={"workload": "w"}),
        ]
    )
    tainted = {"n0": {"spec": {"taints": [{"key": "gpuefficiency.io/gpu-fault"}]}}}
    decided = tracker.step(Observation(t=3.0, nodes=tainted), NAMES, h)
    assert [(o.index, o.passed) for o in decided] == [(0, False)]
    (abandoned,) = tracker.abandon(4.0, "the operator exited with code 1")
    assert not abandoned.passed
    assert abandoned.observed.startswith("the operator exited with code 1; last observed:")


def test_default_names_read_like_sentences() -> None:
    assert (
        describe(expectation(within="2m", podEvicted={"workload": "w"}))
        == "an original pod of w is evicted within 2m"
    )
    assert (
        describe(expectation(within="90s", podNotEvicted={"workload": "w"}))
        == "no pod of w is evicted for 1m30s"
    )
    assert (
        describe(
            expectation(
                within="60s",
                podAnnotation={"workload": "w", "key": "gpuefficiency.io/state", "equals": "Idle"},
            )
        )
        == "w pod annotation gpuefficiency.io/state == 'Idle' within 1m"
    )
    assert describe(expectation(within="1m", after="30s", nodeNotTainted={"node": "n0"})) == (
        "node n0 not tainted gpuefficiency.io/gpu-fault from 30s for 1m"
    )


def test_workload_object_reads_a_field_or_an_annotation_of_the_owner_itself() -> None:
    replicas = expectation(
        workloadObject={"workload": "w", "field": "spec.replicas", "equals": 0}, within="60s"
    )
    previous = expectation(
        workloadObject={"workload": "w", "annotation": "gpuefficiency.io/previous-replicas", "equals": "2"},
        within="60s",
    )
    scaled = {
        "metadata": {"annotations": {"gpuefficiency.io/previous-replicas": "2"}},
        "spec": {"replicas": 0},
    }
    running = {"metadata": {}, "spec": {"replicas": 2}}
    for e in (replicas, previous):
        assert check(e, Observation(t=1, workloads={("pre-ns", "w"): scaled}), NAMES, histories()).ok
        assert not check(e, Observation(t=1, workloads={("pre-ns", "w"): running}), NAMES, histories()).ok
        assert not check(e, Observation(t=1, workloads={("pre-ns", "w"): None}), NAMES, histories()).ok
    assert (
        "spec.replicas = 0"
        in check(replicas, Observation(t=1, workloads={("pre-ns", "w"): scaled}), NAMES, histories()).observed
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"workload": "w", "equals": 0},
        {"workload": "w", "field": "spec.replicas", "annotation": "a", "equals": 0},
    ],
)
def test_workload_object_needs_exactly_one_place(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exactly one of field and annotation"):
        expectation(workloadObject=bad, within="60s")


def test_current_pods_counts_pods_that_are_neither_terminating_nor_finished() -> None:
    none_left = expectation(currentPods={"workload": "w", "equals": 0}, within="60s")
    pods = [pod("w-a", "a", deleting=True), pod("w-b", "b")]
    assert not check(none_left, Observation(t=1, pods=pods), NAMES, histories()).ok
    assert check(none_left, Observation(t=1, pods=pods[:1]), NAMES, histories()).ok
    assert describe(none_left).startswith("current pods of w == 0")


def test_current_pods_with_a_phase_counts_only_pods_in_that_phase() -> None:
    """A queued job's pod is Pending until freed GPUs let it run: the demo checks both phases."""
    waiting = expectation(currentPods={"workload": "w", "phase": "Pending", "equals": 1}, within="60s")
    running = expectation(currentPods={"workload": "w", "phase": "Running", "equals": 1}, within="60s")
    pending_pod = pod("w-a", "a")
    pending_pod["status"]["phase"] = "Pending"
    assert check(waiting, Observation(t=1, pods=[pending_pod]), NAMES, histories()).ok
    assert not check(running, Observation(t=1, pods=[pending_pod]), NAMES, histories()).ok
    assert check(running, Observation(t=1, pods=[pod("w-a", "a")]), NAMES, histories()).ok
    assert not check(waiting, Observation(t=1, pods=[pod("w-a", "a")]), NAMES, histories()).ok
    assert (
        "1 current Running pod(s) of w"
        in check(running, Observation(t=1, pods=[pod("w-a", "a")]), NAMES, histories()).observed
    )
    with pytest.raises(ValueError, match="phase"):
        expectation(currentPods={"workload": "w", "phase": "Succeeded", "equals": 1}, within="60s")
