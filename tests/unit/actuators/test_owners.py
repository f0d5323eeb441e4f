"""Owner actuators: scale to zero through /scale, suspend, stop, with the way back recorded first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.owners import reclaim_owner
from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.engine.model import OwnerRef, ReclaimOwner
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.engine.settle import fold_outcomes

from .fake_custom import FakeCustom

NOW = 1_700_000_000.0
DEPLOY = ("apps", "v1", "ml", "deployments", "nb")
JOB = ("batch", "v1", "ml", "jobs", "train")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "ml", "jobsets", "w")
NOTEBOOK = ("kubeflow.org", "v1", "ml", "notebooks", "lab")


def action(kind: str, name: str, what: str, api_version: str = "apps/v1") -> ReclaimOwner:
    return ReclaimOwner(
        namespace="ml", owner=OwnerRef(api_version, kind, name, f"uid-{name}"), action=what, pods=(("p-0", "uid-p-0"),),
        reason=f"all 1 GPU pod(s) of {kind.lower()}/{name} idle since ...", policy="idle-policy",
    )  # fmt: skip


def test_scale_to_zero_records_the_way_back_then_scales() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert (outcome.result, outcome.message) == (Result.DONE, "replicas 3 -> 0")
    assert obj["spec"]["replicas"] == 0
    ann = obj["metadata"]["annotations"]
    assert ann[names.PREVIOUS_REPLICAS] == "3"
    assert ann[names.RECLAIMED] == "ScaleToZero"
    assert ann[names.RECLAIMED_BY] == "idle-policy"
    assert ann[names.RECLAIMED_AT] == "2023-11-14T22:13:20Z"
    assert "idle since" in ann[names.RECLAIM_REASON]
    assert api.calls == ["get scale", "patch", "patch scale"]


def test_scale_to_zero_of_an_owner_already_at_zero_writes_nothing() -> None:
    api = FakeCustom()
    api.add(DEPLOY, replicas=0)
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert api.calls == ["get scale"]


def test_a_scale_changed_by_someone_else_meanwhile_is_not_overwritten() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)

    def someone_scales(fake: FakeCustom) -> None:
        obj["spec"]["replicas"] = 5
        obj["metadata"]["resourceVersion"] = "7"

    api.on["patch"] = someone_scales
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert "409" in outcome.message
    assert obj["spec"]["replicas"] == 5
    assert names.RECLAIMED not in obj["metadata"]["annotations"]


def test_a_failed_scale_rolls_the_record_back_and_is_reported_failed() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=2)
    api.fail["patch scale"] = 403
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.FAILED
    assert "HTTP 403 at scale" in outcome.message
    assert obj["spec"]["replicas"] == 2
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)


@pytest.mark.parametrize("step", ["get scale", "patch", "patch scale"])
def test_a_standalone_replicaset_of_an_hpa_fails_at_each_step_without_a_false_record(step: str) -> None:
    """ReplicaSets and HPA targets go through the same /scale path: an API error at any step
    leaves the replicas and no record claiming a scale-down (the HPA's name included)."""
    api = FakeCustom()
    obj = api.add(("apps", "v1", "ml", "replicasets", "rs"), replicas=2)
    api.always[step] = 500  # every time: a /scale PATCH not applied is re-read and retried
    hpa = replace(action("ReplicaSet", "rs", "ScaleToZero"), autoscaler="rs-hpa")
    outcome = reclaim_owner(api, hpa, NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.FAILED
    assert obj["spec"]["replicas"] == 2
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)
    api.always.clear()
    assert reclaim_owner(api, hpa, NOW).result is Result.DONE  # type: ignore[arg-type]
    assert obj["metadata"]["annotations"][names.RECLAIMED_AUTOSCALER] == "horizontalpodautoscaler/rs-hpa"


@pytest.mark.parametrize(
    ("key", "kind", "api_version"), [(JOB, "Job", "batch/v1"), (JOBSET, "JobSet", "jobset.x-k8s.io/v1alpha2")]
)
def test_suspend_sets_spec_suspend_and_the_record_in_one_write(key: Any, kind: str, api_version: str) -> None:
    api = FakeCustom()
    obj = api.add(key, suspend=False)
    outcome = reclaim_owner(api, action(kind, key[4], "Suspend", api_version), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE
    assert obj["spec"]["suspend"] is True
    assert obj["metadata"]["annotations"][names.RECLAIMED] == "Suspend"
    assert names.PREVIOUS_REPLICAS not in obj["metadata"]["annotations"]
    assert api.calls == ["patch"]


def test_stop_sets_the_kubeflow_annotation() -> None:
    api = FakeCustom()
    obj = api.add(NOTEBOOK)
    outcome = reclaim_owner(api, action("Notebook", "lab", "Stop", "kubeflow.org/v1"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE
    assert obj["metadata"]["annotations"][names.KUBEFLOW_STOPPED] == "2023-11-14T22:13:20Z"
    assert obj["metadata"]["annotations"][names.RECLAIMED] == "Stop"


def test_a_same_named_successor_is_never_touched() -> None:
    api = FakeCustom()
    obj = api.add(JOB, suspend=False)
    obj["metadata"]["uid"] = "uid-of-a-new-job"
    outcome = reclaim_owner(api, action("Job", "train", "Suspend", "batch/v1"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert obj["spec"]["suspend"] is False


def test_gone_is_skipped_and_forbidden_is_failed() -> None:
    api = FakeCustom()
    assert reclaim_owner(api, action("Job", "train", "Suspend", "batch/v1"), NOW).result is Result.SKIPPED  # type: ignore[arg-type]
    api.add(JOB)
    api.fail["patch"] = 403
    assert reclaim_owner(api, action("Job", "train", "Suspend", "batch/v1"), NOW).result is Result.FAILED  # type: ignore[arg-type]


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, ref: Any, reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((ref.kind, ref.name, reason, message))


def test_the_applier_emits_the_events_with_the_restore_command_on_owner_pods_and_policy() -> None:
    api = FakeCustom()
    api.add(DEPLOY, replicas=1)
    events = _Events()
    applier = Applier(api_client=client.ApiClient(), recorder=events)  # type: ignore[arg-type]
    applier.custom = api  # type: ignore[assignment]
    outcomes = applier.apply(
        [action("Deployment", "nb", "ScaleToZero")], policy_name="idle-policy", policy_uid="u"
    )
    assert [o.result for o in outcomes] == [Result.DONE]
    assert [(k, n, r) for k, n, r, _ in events.recorded] == [
        ("Deployment", "nb", names.EV_RECLAIMED),
        ("Pod", "p-0", names.EV_RECLAIMED),
        ("GPUEfficiencyPolicy", "idle-policy", names.EV_RECLAIMED),
    ]
    owner_message = events.recorded[0][3]
    assert "gpu-efficiency restore deployment/nb -n ml" in owner_message
    assert "kubectl scale deployment/nb -n ml --replicas=" in owner_message
    assert applier.writes == 4  # the reclaim and its three events


def test_a_failed_reclaim_emits_nothing_and_a_done_one_counts_in_the_hour_budget() -> None:
    api = FakeCustom()
    api.add(DEPLOY, replicas=1)
    api.fail["get scale"] = 500
    events = _Events()
    applier = Applier(api_client=client.ApiClient(), recorder=events)  # type: ignore[arg-type]
    applier.custom = api  # type: ignore[assignment]
    failed = applier.apply([action("Deployment", "nb", "ScaleToZero")], policy_name="p", policy_uid="u")
    assert [o.result for o in failed] == [Result.FAILED]
    assert events.recorded == []
    status = GPUEfficiencyPolicyStatus()
    assert fold_outcomes(status, failed, NOW).recent_evictions == []
    done = [Outcome(action("Deployment", "nb", "ScaleToZero"), Result.DONE)]
    folded = fold_outcomes(status, done, NOW)
    assert folded.recent_evictions == ["2023-11-14T22:13:20Z"]
    assert (folded.reclaims_total, folded.evictions_total) == (1, 0)
    assert fold_outcomes(status, failed, NOW).reclaims_total == 0


def test_a_reclamation_record_is_kept_only_when_its_action_was_accepted() -> None:
    scale = action("Deployment", "nb", "ScaleToZero")
    other = action("Deployment", "other", "ScaleToZero")
    record = Reclamation(owner="ml/Deployment/nb", action="ScaleToZero", time="2023-11-14T22:13:20Z", gpus=1)
    draft = Reclamation(
        owner="ml/Deployment/other", action="ScaleToZero", time="2023-11-14T22:13:20Z", gpus=1
    )
    drafts = [((scale,), record), ((other,), draft)]
    outcomes = [Outcome(scale, Result.DONE), Outcome(other, Result.FAILED)]
    status = fold_outcomes(GPUEfficiencyPolicyStatus(), outcomes, NOW, drafts)
    assert [r.owner for r in status.reclamations] == ["ml/Deployment/nb"]
    failed = fold_outcomes(GPUEfficiencyPolicyStatus(), [Outcome(scale, Result.FAILED)], NOW, drafts)
    assert failed.reclamations == []
