"""The /scale PATCH after the undo record: the record bumps a Deployment's generation (kube-apiserver's
deployment strategy: "annotation updates bump the generation because annotations are copied from
deployments to their replica sets"), and the deployment controller writes status.observedGeneration
within milliseconds, so the resourceVersion the record's write returned is usually stale by the time
the /scale PATCH arrives. Seen in the chaos e2e: the same Deployment answered 409 for 18 cycles in a
row, each cycle rolling its record back and writing it again (which bumped the generation again).

A conflict is re-read and retried while the owner still holds the replicas recorded; a change to
the replicas by someone else is never overwritten."""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.owners import reclaim_owner
from gpu_efficiency.api import names
from gpu_efficiency.engine.outcomes import Result

from .fake_custom import FakeCustom
from .test_owners import DEPLOY, NOW, action


def controller_writes_status(obj: dict[str, Any], times: int) -> Any:
    """A hook for the next ``times`` /scale PATCHes: the deployment controller's status write after
    the generation bump lands first (a new resourceVersion, the replicas untouched)."""

    def hook(fake: FakeCustom) -> None:
        meta = obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        obj.setdefault("status", {})["observedGeneration"] = meta.get("generation", 1)
        if fake.calls.count("patch scale") < times:
            fake.on["patch scale"] = hook

    return hook


class Gateway(FakeCustom):
    """A gateway in front of the API server that answers every /scale PATCH with 504, whatever the
    server did with it (the e2e fault proxy's "commit then 504": a 409 upstream is masked too)."""

    def patch_namespaced_custom_object_scale(self, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(ApiException):
            super().patch_namespaced_custom_object_scale(*args, **kwargs)
        raise ApiException(status=504, reason="Gateway Timeout")


def test_a_conflict_from_the_controllers_status_write_is_retried_and_the_owner_scaled() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    api.on["patch scale"] = controller_writes_status(obj, times=1)
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert (outcome.result, outcome.message) == (Result.DONE, "replicas 3 -> 0")
    assert obj["spec"]["replicas"] == 0
    assert obj["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "3"
    assert api.calls == ["get scale", "patch", "patch scale", "get scale", "patch scale"]


def test_a_conflict_masked_as_a_504_is_re_read_retried_and_settled_as_done() -> None:
    api = Gateway()
    obj = api.add(DEPLOY, replicas=3)
    api.on["patch scale"] = controller_writes_status(obj, times=1)
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.DONE, outcome.message
    assert "the server holds 0" in outcome.message
    assert obj["spec"]["replicas"] == 0
    assert obj["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "3"


def test_conflicts_on_every_try_give_up_for_the_cycle_and_roll_the_record_back() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    api.on["patch scale"] = controller_writes_status(obj, times=99)
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert "409" in outcome.message
    assert api.calls.count("patch scale") == 5
    assert obj["spec"]["replicas"] == 3
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)


def test_a_conflict_from_someone_scaling_meanwhile_is_not_retried_nor_overwritten() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)

    def someone_scales(fake: FakeCustom) -> None:
        obj["spec"]["replicas"] = 5
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    api.on["patch scale"] = someone_scales
    outcome = reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert "now 5 replicas, was 3" in outcome.message
    assert api.calls.count("patch scale") == 1
    assert obj["spec"]["replicas"] == 5
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)
