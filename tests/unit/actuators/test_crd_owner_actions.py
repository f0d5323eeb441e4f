"""Suspend and Deactivate of KubeRay, Kubeflow training and Kueue owners, each at its own switch,
and ``gpu-efficiency restore`` bringing each back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpu_efficiency.actuators.owners import reclaim_events, reclaim_owner
from gpu_efficiency.api import names
from gpu_efficiency.engine.model import OwnerRef
from gpu_efficiency.engine.outcomes import Result
from gpu_efficiency.restore import RestoreError, restore

from .fake_custom import FakeCustom, Key
from .test_owners import NOW, action

KINDS: list[tuple[str, str, str, tuple[str, ...]]] = [
    # kind, apiVersion, plural, the switch under spec
    ("RayCluster", "ray.io/v1", "rayclusters", ("suspend",)),
    ("RayJob", "ray.io/v1", "rayjobs", ("suspend",)),
    ("PyTorchJob", "kubeflow.org/v1", "pytorchjobs", ("runPolicy", "suspend")),
    ("MPIJob", "kubeflow.org/v1", "mpijobs", ("runPolicy", "suspend")),
    ("TFJob", "kubeflow.org/v1", "tfjobs", ("runPolicy", "suspend")),
    ("TrainJob", "trainer.kubeflow.org/v1alpha1", "trainjobs", ("suspend",)),
]


def key(api_version: str, plural: str, name: str) -> Key:
    group, _, version = api_version.rpartition("/")
    return (group, version, "ml", plural, name)


def at(obj: dict[str, object], path: tuple[str, ...]) -> object:
    value: object = obj["spec"]
    for part in path:
        assert isinstance(value, dict), obj
        value = value.get(part)
    return value


@pytest.mark.parametrize(("kind", "api_version", "plural", "path"), KINDS)
def test_each_kind_is_suspended_at_its_switch_and_restored(
    kind: str, api_version: str, plural: str, path: tuple[str, ...]
) -> None:
    api = FakeCustom()
    obj = api.add(key(api_version, plural, "x"), runPolicy={"cleanPodPolicy": "None"})
    outcome = reclaim_owner(api, action(kind, "x", "Suspend", api_version), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE, outcome
    assert at(obj, path) is True
    assert obj["spec"]["runPolicy"]["cleanPodPolicy"] == "None"  # a merge patch: the rest kept
    assert obj["metadata"]["annotations"][names.RECLAIMED] == "Suspend"
    assert api.calls == ["patch"]  # the switch and the way back in one write

    api.record(key(api_version, plural, "x"), kind, "Suspend")  # the policy's proof of our reclaim
    message = restore(api, f"{kind.lower()}/x", "ml")  # type: ignore[arg-type]
    assert message == f"restored {kind.lower()}/x in ml: resumed (spec.{'.'.join(path)}=false)"
    assert at(obj, path) is False
    assert not set(obj["metadata"]["annotations"]) & set(names.OWNER_ANNOTATIONS)


WORKLOAD = key("kueue.x-k8s.io/v1beta2", "workloads", "job-train-3f2a1")


def test_a_kueue_workload_is_deactivated_then_reactivated() -> None:
    api = FakeCustom()
    obj = api.add(WORKLOAD, active=True, queueName="team-q")
    deactivate = action("Workload", "job-train-3f2a1", "Deactivate", "kueue.x-k8s.io/v1beta2")
    outcome = reclaim_owner(api, deactivate, NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE, outcome
    assert obj["spec"] == {"active": False, "queueName": "team-q"}
    assert "suspend" not in obj["spec"]  # never Kueue's switch
    assert obj["metadata"]["annotations"][names.RECLAIMED] == "Deactivate"

    api.record(WORKLOAD, "Workload", "Deactivate")
    events: list[str] = []
    message = restore(api, "workload/job-train-3f2a1", "ml", lambda ref, text: events.append(ref.api_version))  # type: ignore[arg-type]
    assert message == "restored workload/job-train-3f2a1 in ml: reactivated (spec.active=true)"
    assert obj["spec"]["active"] is True
    assert not set(obj["metadata"]["annotations"]) & set(names.OWNER_ANNOTATIONS)
    assert events == ["kueue.x-k8s.io/v1beta2"]


def test_restore_finds_a_workload_served_only_as_v1beta1() -> None:
    api = FakeCustom()
    old = key("kueue.x-k8s.io/v1beta1", "workloads", "wl")
    obj = api.add(old, active=False, annotations={names.RECLAIMED: "Deactivate"})
    api.record(old, "Workload", "Deactivate")
    assert "reactivated" in restore(api, "workload/wl", "ml")  # type: ignore[arg-type]
    assert obj["spec"]["active"] is True
    with pytest.raises(RestoreError, match="workload/none not found in namespace ml"):
        restore(api, "workload/none", "ml")  # type: ignore[arg-type]


def test_an_api_error_or_a_successor_changes_nothing() -> None:
    api = FakeCustom()
    obj = api.add(WORKLOAD, active=True)
    deactivate = action("Workload", "job-train-3f2a1", "Deactivate", "kueue.x-k8s.io/v1beta2")
    api.fail["patch"] = 500
    outcome = reclaim_owner(api, deactivate, NOW)  # type: ignore[arg-type]
    # a 500 may have been applied: the re-read settles it (issue 31.2)
    assert (outcome.result, outcome.message) == (
        Result.FAILED,
        "HTTP 500 Injected at patch; the re-read shows the owner unchanged",
    )
    assert obj["spec"]["active"] is True
    assert names.RECLAIMED not in obj["metadata"]["annotations"]
    obj["metadata"]["uid"] = "uid-successor"  # deleted and recreated under the same name
    outcome = reclaim_owner(api, deactivate, NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert "409" in outcome.message
    assert obj["spec"]["active"] is True


def test_the_job_kueue_admits_gets_the_reclaimed_event_with_the_way_back() -> None:
    job = OwnerRef("batch/v1", "Job", "train", "uid-train")
    deactivate = replace(
        action("Workload", "job-train-3f2a1", "Deactivate", "kueue.x-k8s.io/v1beta2"), admitted=job
    )
    events = reclaim_events(deactivate)
    assert [(r.kind, r.name, r.uid, r.api_version) for r, _ in events] == [
        ("Workload", "job-train-3f2a1", "uid-job-train-3f2a1", "kueue.x-k8s.io/v1beta2"),
        ("Job", "train", "uid-train", "batch/v1"),
        ("Pod", "p-0", "uid-p-0", "v1"),
    ]
    assert all("gpu-efficiency restore workload/job-train-3f2a1 -n ml" in m for _, m in events)
