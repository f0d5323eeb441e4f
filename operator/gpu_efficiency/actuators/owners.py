"""Owner writes: scale to zero through ``/scale``, suspend, stop, deactivate (a Kueue Workload);
and their undo (``restore``).

The way back is written on the owner before the destructive write (previous replicas, when, by
which policy, why), so it is never lost: a failed write after it is rolled back (only when a re-read shows the owner
unchanged: a write that failed with a 5xx or a timeout may have been applied), and a record left
on an owner that was not changed is harmless (the engine takes an owner as reclaimed only while it
is still at 0 replicas, suspended or stopped). Every write carries the owner's uid (never a
same-named successor) and, for scaling, the resourceVersion read with the replicas, so a change
made meanwhile by someone else fails the write (409) instead of being overwritten; a 409 is
re-read and the write retried only while the owner still holds the replicas recorded.

Built-in kinds go through the same generic paths as CRDs (``/apis/GROUP/VERSION/...``), one client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpu_efficiency.actuators.events import ObjectRef, pod_ref
from gpu_efficiency.actuators.uncertain import describe, outcome_unknown
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.api.suspend_fields import suspend_patch
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine import restore_commands
from gpu_efficiency.engine.model import OwnerRef, ReclaimOwner
from gpu_efficiency.engine.outcomes import Outcome, Result

MERGE = "application/merge-patch+json"
PLURALS: Mapping[str, str] = {
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "StatefulSet": "statefulsets",
    "LeaderWorkerSet": "leaderworkersets",
    "Job": "jobs",
    "JobSet": "jobsets",
    "Notebook": "notebooks",
    "RayCluster": "rayclusters",
    "RayJob": "rayjobs",
    "PyTorchJob": "pytorchjobs",
    "MPIJob": "mpijobs",
    "TFJob": "tfjobs",
    "TrainJob": "trainjobs",
    "Workload": "workloads",  # Kueue's: Deactivate
}


@dataclass(frozen=True, slots=True)
class Target:
    """Where an owner lives in the API."""

    group: str
    version: str
    namespace: str
    plural: str
    name: str

    @classmethod
    def of(cls, namespace: str, ref: OwnerRef) -> Target:
        group, _, version = ref.api_version.rpartition("/")
        return cls(group, version, namespace, PLURALS[ref.kind], ref.name)


def _patch(api: client.CustomObjectsApi, t: Target, body: Mapping[str, Any]) -> Any:
    return api.patch_namespaced_custom_object(
        t.group, t.version, t.namespace, t.plural, t.name, dict(body), _content_type=MERGE
    )


def undo_record(action: ReclaimOwner, now: float, previous_replicas: int | None) -> dict[str, str | None]:
    record: dict[str, str | None] = {
        names.RECLAIMED: action.action,
        names.RECLAIMED_AT: format_rfc3339(now),
        names.RECLAIMED_BY: action.policy,
        names.RECLAIM_REASON: action.reason[:1024],
        names.PREVIOUS_REPLICAS: None if previous_replicas is None else str(previous_replicas),
        names.RECLAIMED_AUTOSCALER: f"horizontalpodautoscaler/{action.autoscaler}"
        if action.autoscaler
        else None,
    }
    return record


def _skip_or_fail(action: ReclaimOwner, exc: ApiException, step: str) -> Outcome:
    if exc.status == 404:
        return Outcome(action, Result.SKIPPED, f"owner gone (HTTP 404 at {step})")
    if exc.status == 409:
        return Outcome(
            action, Result.SKIPPED, f"owner changed meanwhile (HTTP 409 at {step}): retried next cycle"
        )
    return Outcome(action, Result.FAILED, f"HTTP {exc.status} at {step}: {exc.reason}")


def reclaim_owner(api: client.CustomObjectsApi, action: ReclaimOwner, now: float) -> Outcome:
    """Apply one ReclaimOwner; DONE only when the owner's state was changed by the API server,
    UNKNOWN when it may have been and a re-read cannot tell (counted as done by every budget)."""
    target = Target.of(action.namespace, action.owner)
    if action.action == ReclaimAction.SCALE_TO_ZERO:
        return _scale_to_zero(api, action, target, now)
    body: dict[str, Any] = {
        "metadata": {"uid": action.owner.uid, "annotations": undo_record(action, now, None)}
    }
    if action.action in (ReclaimAction.SUSPEND, ReclaimAction.DEACTIVATE):
        body["spec"] = suspend_patch(action.owner.kind, True)  # a Workload: spec.active=false
    elif action.action == ReclaimAction.STOP:
        body["metadata"]["annotations"][names.KUBEFLOW_STOPPED] = format_rfc3339(now)
    else:
        return Outcome(action, Result.FAILED, f"unknown owner action {action.action!r}")
    try:
        _patch(api, target, body)
    except (ApiException, HTTPError, OSError) as exc:
        why = outcome_unknown(exc)
        if not why:
            if isinstance(exc, ApiException):
                return _skip_or_fail(action, exc, "patch")
            return Outcome(action, Result.FAILED, f"{describe(exc)} at patch")
        return _settle_patch(api, action, target, now, why)
    return Outcome(action, Result.DONE)


def _settle_patch(
    api: client.CustomObjectsApi, action: ReclaimOwner, t: Target, now: float, why: str
) -> Outcome:
    """The suspend/stop patch failed ambiguously (``why``): what does the server hold? The patch is
    one write (record and state together), so there is nothing to roll back.

    The re-read is a LIST by name, not a GET: the chart's role lets the operator list and patch
    owners (Jobs, Notebooks, the CRD kinds), never get them, and a refused re-read would leave every
    such outcome UNKNOWN."""
    try:
        found: Any = api.list_namespaced_custom_object(
            t.group, t.version, t.namespace, t.plural, field_selector=f"metadata.name={t.name}"
        )
    except (ApiException, HTTPError, OSError) as exc:
        return Outcome(action, Result.UNKNOWN, f"{why} at patch, and the re-read failed: {describe(exc)}")
    items = found.get("items") if isinstance(found, dict) else None
    if not isinstance(items, list):
        return Outcome(action, Result.UNKNOWN, f"{why} at patch, and the re-read answered no list")
    obj = next((o for o in items if isinstance(o, dict)), None)
    if obj is None:
        return Outcome(action, Result.SKIPPED, f"owner gone ({why} at patch, then not listed)")
    meta = obj.get("metadata") or {}
    if action.owner.uid and meta.get("uid") != action.owner.uid:
        return Outcome(action, Result.SKIPPED, f"owner replaced ({why} at patch)")
    ours = (meta.get("annotations") or {}).get(names.RECLAIMED_AT) == format_rfc3339(now)
    if ours:
        return Outcome(action, Result.DONE, f"applied although the API answered {why}")
    return Outcome(action, Result.FAILED, f"{why} at patch; the re-read shows the owner unchanged")


def _scale_to_zero(api: client.CustomObjectsApi, action: ReclaimOwner, t: Target, now: float) -> Outcome:
    try:
        scale: Any = api.get_namespaced_custom_object_scale(t.group, t.version, t.namespace, t.plural, t.name)
    except ApiException as exc:
        return _skip_or_fail(action, exc, "get scale")
    replicas = int(((scale.get("spec") or {}).get("replicas")) or 0)
    version = (scale.get("metadata") or {}).get("resourceVersion")
    if replicas == 0:
        return Outcome(action, Result.SKIPPED, "already at 0 replicas")
    record = {
        "uid": action.owner.uid,
        "resourceVersion": version,
        "annotations": undo_record(action, now, replicas),
    }
    try:
        written: Any = _patch(api, t, {"metadata": record})
    except ApiException as exc:
        # Ambiguous or not, the replicas are untouched: a record that did land on an owner not at
        # 0 replicas is harmless (nothing takes it as reclaimed) and is overwritten next time.
        return _skip_or_fail(action, exc, "annotate")
    version = (written.get("metadata") or {}).get("resourceVersion") if isinstance(written, dict) else None
    return _write_scale(api, action, t, replicas, version)


def _write_scale(
    api: client.CustomObjectsApi, action: ReclaimOwner, t: Target, replicas: int, version: str | None
) -> Outcome:
    """The /scale PATCH, with the resourceVersion precondition, retried on a conflict while the
    owner still holds the replicas recorded (client-go's ``RetryOnConflict``, ``DefaultRetry``).

    A 409 here is expected, not rare: the record just written bumps a Deployment's generation (its
    annotations are copied to its ReplicaSets), and the deployment controller writes
    ``status.observedGeneration`` within milliseconds, a new resourceVersion before this PATCH
    arrives. A write answered ambiguously (5xx, timeout) is settled by a re-read of ``/scale``:
    at 0 it was applied; still at the replicas recorded it was not, and is retried the same way."""
    ambiguous = ""  # why an earlier write, one that may have been applied, failed ("" if none)
    for attempt in range(1, SCALE_ATTEMPTS + 1):
        body = {"metadata": {"resourceVersion": version} if version else {}, "spec": {"replicas": 0}}
        try:
            api.patch_namespaced_custom_object_scale(
                t.group, t.version, t.namespace, t.plural, t.name, body, _content_type=MERGE
            )
        except (ApiException, HTTPError, OSError) as exc:
            why = outcome_unknown(exc)
            conflict = isinstance(exc, ApiException) and exc.status == 409
            if not why and not conflict:
                _roll_back(api, action, t)
                if isinstance(exc, ApiException):
                    return _skip_or_fail(action, exc, "scale")
                return Outcome(action, Result.FAILED, f"{describe(exc)} at scale")
            ambiguous = why or ambiguous
            read = _reread_scale(
                api, action, t, replicas=replicas, why=why or "HTTP 409 Conflict", ambiguous=ambiguous
            )
            if isinstance(read, Outcome):
                return read
            if attempt < SCALE_ATTEMPTS and read:
                version = read  # still at the replicas recorded: the same write, at the new version
                continue
            _roll_back(api, action, t)  # known unchanged: the record must not claim a scale-down
            if why:
                return Outcome(
                    action, Result.FAILED, f"{why} at scale; the re-read shows {replicas} replicas, unchanged"
                )
            if isinstance(exc, ApiException):  # a conflict, always: anything else returned above
                return _skip_or_fail(action, exc, "scale")
            return Outcome(action, Result.FAILED, f"{describe(exc)} at scale")
        if ambiguous:
            return Outcome(
                action, Result.DONE, f"replicas {replicas} -> 0 (an earlier try was answered {ambiguous})"
            )
        return Outcome(action, Result.DONE, f"replicas {replicas} -> 0")
    raise AssertionError("unreachable: every attempt returns or continues")


#: Writes of one /scale PATCH before giving up for this cycle: client-go's ``retry.DefaultRetry``.
SCALE_ATTEMPTS = 5


def _roll_back(api: client.CustomObjectsApi, action: ReclaimOwner, t: Target) -> None:
    """The record must not claim a scale-down that did not happen; if this fails too, it is
    harmless: an owner not at 0 replicas is not taken as reclaimed."""
    with contextlib.suppress(ApiException, HTTPError, OSError):
        undo = {"uid": action.owner.uid, "annotations": dict.fromkeys(names.OWNER_ANNOTATIONS)}
        _patch(api, t, {"metadata": undo})


def _reread_scale(
    api: client.CustomObjectsApi, action: ReclaimOwner, t: Target, *, replicas: int, why: str, ambiguous: str
) -> Outcome | str:
    """After a failed /scale PATCH (``why``; ``ambiguous``: why one of the tries may have been
    applied, '' if none): decide from what the server holds. An Outcome when that settles it; else
    the owner is still at ``replicas``, untouched: the resourceVersion to try again with.

    At 0 after an ambiguous try, it was applied (DONE); at 0 after conflicts only, someone else
    scaled it (the record is rolled back). Any other count, or no answer, after an ambiguous try is
    UNKNOWN: counted as done, the way back kept on the owner."""
    try:
        scale: Any = api.get_namespaced_custom_object_scale(t.group, t.version, t.namespace, t.plural, t.name)
    except (ApiException, HTTPError, OSError) as exc:
        if ambiguous:
            return Outcome(
                action,
                Result.UNKNOWN,
                f"{why} at scale, and the re-read failed ({describe(exc)}): record kept",
            )
        _roll_back(api, action, t)
        return Outcome(
            action, Result.SKIPPED, f"owner changed meanwhile ({why} at scale): retried next cycle"
        )
    now_at = int(((scale.get("spec") or {}).get("replicas")) or 0)
    if now_at == replicas:
        version = (scale.get("metadata") or {}).get("resourceVersion")
        return str(version or "")  # '' (no version to hold the next try to): not retried
    if now_at == 0 and ambiguous:
        return Outcome(
            action,
            Result.DONE,
            f"replicas {replicas} -> 0 (the API answered {ambiguous}; the server holds 0)",
        )
    if ambiguous:
        return Outcome(
            action,
            Result.UNKNOWN,
            f"{why} at scale; the re-read shows {now_at} replicas (was {replicas}): record kept",
        )
    _roll_back(api, action, t)
    return Outcome(
        action,
        Result.SKIPPED,
        f"owner changed meanwhile ({why} at scale; now {now_at} replicas, was {replicas}): retried next cycle",
    )


def owner_ref(action: ReclaimOwner) -> ObjectRef:
    o = action.owner
    return ObjectRef(
        kind=o.kind, name=o.name, uid=o.uid, namespace=action.namespace, api_version=o.api_version
    )


def reclaim_events(action: ReclaimOwner) -> list[tuple[ObjectRef, str]]:
    """The GPUReclaimed events of a done reclaim: on the owner (and the job a Kueue Workload admits,
    where its user looks) and on each of its GPU pods, each with the exact way back."""
    way_back = restore_commands(action.namespace, action.owner.kind, action.owner.name)
    message = f"{action.reason}. {way_back}"
    refs = [owner_ref(action)] + [pod_ref(action.namespace, name, uid) for name, uid in action.pods]
    if action.admitted is not None:
        job = action.admitted
        refs.insert(1, ObjectRef(job.kind, job.name, job.uid, action.namespace, job.api_version))
    return [(ref, message) for ref in refs]
