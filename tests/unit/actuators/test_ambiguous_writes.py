"""Issue 31.2: a write the API server committed but answered with a 5xx, a timeout or a reset.

The outcome is decided from what the server holds after a re-read, never from the error alone: the
undo record is rolled back only when the owner is seen unchanged, and an outcome the re-read cannot
settle is UNKNOWN, which every budget counts as done and whose reclamation record is kept."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError

from gpu_efficiency.actuators.owners import reclaim_owner
from gpu_efficiency.actuators.pods import evict_pod
from gpu_efficiency.actuators.uncertain import outcome_unknown
from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.engine.model import EvictPod, OwnerRef, ReclaimOwner
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.engine.settle import fold_outcomes

from .fake_custom import FakeCustom

NOW = 1_700_000_000.0
DEPLOY = ("apps", "v1", "ml", "deployments", "nb")
JOB = ("batch", "v1", "ml", "jobs", "train")


def gateway_timeout() -> ApiException:
    return ApiException(status=504, reason="Gateway Timeout")


def scale_action() -> ReclaimOwner:
    return ReclaimOwner(
        namespace="ml", owner=OwnerRef("apps/v1", "Deployment", "nb", "uid-nb"), action="ScaleToZero",
        pods=(("p-0", "uid-p-0"),), reason="idle", policy="idle-policy",
    )  # fmt: skip


def suspend_action() -> ReclaimOwner:
    return ReclaimOwner(
        namespace="ml", owner=OwnerRef("batch/v1", "Job", "train", "uid-train"), action="Suspend",
        pods=(("p-0", "uid-p-0"),), reason="idle", policy="idle-policy",
    )  # fmt: skip


@pytest.mark.parametrize(
    "error",
    [
        gateway_timeout(),
        ReadTimeoutError(None, "/scale", "read timed out"),
        ProtocolError("reset", ConnectionResetError()),
    ],  # type: ignore[arg-type]
    ids=["504", "read timeout", "connection reset"],
)
def test_a_scale_committed_then_answered_with_an_error_is_done_and_keeps_its_way_back(
    error: Exception,
) -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    api.after["patch scale"] = error
    outcome = reclaim_owner(api, scale_action(), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE, outcome.message
    assert "the server holds 0" in outcome.message
    assert obj["spec"]["replicas"] == 0
    assert obj["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "3"
    assert obj["metadata"]["annotations"][names.RECLAIMED] == "ScaleToZero"


def test_a_scale_not_applied_behind_a_504_is_failed_and_its_record_rolled_back() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    api.always["patch scale"] = 504  # refused before it was applied, every try
    outcome = reclaim_owner(api, scale_action(), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.FAILED
    assert "unchanged" in outcome.message
    assert api.calls.count("patch scale") == 5  # re-read and retried, client-go's DefaultRetry
    assert obj["spec"]["replicas"] == 3
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)


def test_a_scale_whose_outcome_cannot_be_read_back_is_unknown_and_counted() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    api.after["patch scale"] = gateway_timeout()
    api.on["patch scale"] = lambda fake: fake.fail.__setitem__("get scale", 503)  # the re-read fails too
    outcome = reclaim_owner(api, scale_action(), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.UNKNOWN
    assert obj["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "3"  # the way back stays
    record = Reclamation(owner="ml/Deployment/nb", uid="uid-nb", action="ScaleToZero", time="t", replicas=3)
    status = fold_outcomes(GPUEfficiencyPolicyStatus(), [outcome], NOW, [((outcome.action,), record)])
    assert status.recent_evictions == ["2023-11-14T22:13:20Z"]  # the hour's budget counts it
    assert [r.uid for r in status.reclamations] == ["uid-nb"]  # restore can still find it


def test_a_suspend_committed_then_answered_504_is_done() -> None:
    api = FakeCustom()
    obj = api.add(JOB, suspend=False)
    api.after["patch"] = gateway_timeout()
    outcome = reclaim_owner(api, suspend_action(), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE, outcome.message
    assert obj["spec"]["suspend"] is True


def test_a_suspend_not_applied_behind_a_504_is_failed_and_an_unreadable_one_unknown() -> None:
    api = FakeCustom()
    obj = api.add(JOB, suspend=False)
    api.fail["patch"] = 504
    assert reclaim_owner(api, suspend_action(), NOW).result is Result.FAILED  # type: ignore[arg-type]
    assert obj["spec"]["suspend"] is False
    api.after["patch"] = gateway_timeout()
    api.on["patch"] = lambda fake: fake.fail.__setitem__("list", 500)
    assert reclaim_owner(api, suspend_action(), NOW).result is Result.UNKNOWN  # type: ignore[arg-type]


def test_a_connection_that_never_opened_changed_nothing() -> None:
    assert outcome_unknown(NewConnectionError(None, "refused")) == ""  # type: ignore[arg-type]
    assert outcome_unknown(ApiException(status=409, reason="Conflict")) == ""
    assert outcome_unknown(ApiException(status=500, reason="Internal")) == "HTTP 500 Internal"


class Core:
    """The Eviction API behind a gateway that answers 504 whether or not the eviction went through."""

    def __init__(self, pod: dict[str, Any] | None, read_fails: bool = False) -> None:
        self.pod, self.read_fails = pod, read_fails

    def create_namespaced_pod_eviction(self, *_: object) -> None:
        raise gateway_timeout()

    def list_namespaced_pod(self, *_: object, **kwargs: object) -> Any:
        assert kwargs["field_selector"] == "metadata.name=nb"  # a LIST: the operator may not GET pods
        if self.read_fails:
            raise ApiException(status=403, reason="Forbidden")
        items = [] if self.pod is None else [self.pod]
        return type("Response", (), {"data": orjson.dumps({"items": items})})()


EVICT = EvictPod(namespace="ns", name="nb", uid="u1", reason="idle")


@pytest.mark.parametrize(
    ("pod", "read_fails", "expected"),
    [
        (None, False, Result.DONE),  # gone
        ({"metadata": {"uid": "u1", "deletionTimestamp": "2023-11-14T22:13:20Z"}}, False, Result.DONE),
        ({"metadata": {"uid": "u2"}}, False, Result.DONE),  # replaced by a successor
        ({"metadata": {"uid": "u1"}}, False, Result.FAILED),  # still there: not evicted, retried
        (None, True, Result.UNKNOWN),
    ],
    ids=["gone", "terminating", "replaced", "still-running", "unreadable"],
)
def test_an_eviction_answered_504_is_decided_by_a_re_read(
    pod: dict[str, Any] | None, read_fails: bool, expected: Result
) -> None:
    outcome = evict_pod(Core(pod, read_fails), EVICT)  # type: ignore[arg-type]
    assert outcome.result is expected, outcome.message
    counted = fold_outcomes(GPUEfficiencyPolicyStatus(), [outcome], NOW).recent_evictions
    assert len(counted) == (0 if expected is Result.FAILED else 1)


def test_unknown_outcomes_count_against_the_hour_as_done_ones_do() -> None:
    outcomes = [Outcome(EVICT, Result.UNKNOWN), Outcome(scale_action(), Result.UNKNOWN)]
    assert len(fold_outcomes(GPUEfficiencyPolicyStatus(), outcomes, NOW).recent_evictions) == 2
