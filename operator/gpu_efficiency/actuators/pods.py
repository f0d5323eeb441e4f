"""Pod writes: annotation merge patches and evictions through the policy/v1 Eviction API."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.outcomes import Outcome, Result
from gpu_efficiency.engine.model import AnnotatePod, EvictPod


def annotate_pod(core: client.CoreV1Api, action: AnnotatePod) -> Outcome:
    """Merge-patch annotations, with the pod's uid as a precondition (never a same-named successor).

    The patched pod comes back as raw JSON (orjson: the client's models cost ~10x more to decode)
    for the watch cache to read its own write."""
    body = {"metadata": {"uid": action.uid, "annotations": dict(action.annotations)}}
    try:
        response: Any = core.patch_namespaced_pod(
            action.name,
            action.namespace,
            body,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
    except ApiException as exc:
        if exc.status in (404, 409):
            return Outcome(action, Result.SKIPPED, f"pod gone or replaced (HTTP {exc.status})")
        return Outcome(action, Result.FAILED, f"HTTP {exc.status}: {exc.reason}")
    try:
        written = orjson.loads(response.data)
    except (orjson.JSONDecodeError, TypeError, AttributeError):
        written = None  # the write happened; only read-your-writes is lost
    return Outcome(action, Result.DONE, obj=written if isinstance(written, dict) else None)


def evict_pod(core: client.CoreV1Api, action: EvictPod) -> Outcome:
    """Evict through the front door: PodDisruptionBudgets apply; 429 means blocked, retry later."""
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=action.name, namespace=action.namespace),
        delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=action.uid)),
    )
    try:
        core.create_namespaced_pod_eviction(action.name, action.namespace, body)
    except ApiException as exc:
        if exc.status == 429:
            return Outcome(
                action, Result.BLOCKED, _reason(exc) or "a PodDisruptionBudget allows no disruption"
            )
        if exc.status in (404, 409):
            return Outcome(action, Result.SKIPPED, f"pod gone or replaced (HTTP {exc.status})")
        return Outcome(action, Result.FAILED, f"HTTP {exc.status}: {_reason(exc) or exc.reason}")
    return Outcome(action, Result.DONE)


def _reason(exc: ApiException) -> str:
    import json

    try:
        doc = json.loads(exc.body or "{}")
    except ValueError:
        return ""
    causes = (doc.get("details") or {}).get("causes") or []
    parts = [c.get("message", "") for c in causes] or [doc.get("message", "")]
    return "; ".join(p for p in parts if p)
