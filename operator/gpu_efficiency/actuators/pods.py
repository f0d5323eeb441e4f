"""Pod writes: annotation merge patches and evictions through the policy/v1 Eviction API."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpu_efficiency.actuators.uncertain import describe, outcome_unknown
from gpu_efficiency.engine.model import AnnotatePod, EvictPod
from gpu_efficiency.engine.outcomes import Outcome, Result


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
    """Evict through the front door: PodDisruptionBudgets apply; their 429 means blocked (annotated,
    an event, retried later); a 429 from API Priority and Fairness is no block, only retried."""
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=action.name, namespace=action.namespace),
        delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=action.uid)),
    )
    try:
        core.create_namespaced_pod_eviction(action.name, action.namespace, body)
    except (HTTPError, OSError) as exc:
        why = outcome_unknown(exc)
        return _settle_eviction(core, action, why) if why else Outcome(action, Result.FAILED, describe(exc))
    except ApiException as exc:
        if outcome_unknown(exc):
            return _settle_eviction(core, action, outcome_unknown(exc))
        if exc.status == 429 and _budget_refusal(exc):
            return Outcome(action, Result.BLOCKED, _reason(exc))
        if exc.status == 429:  # API Priority and Fairness: the server is busy, the pod may go
            wait = (exc.headers or {}).get("Retry-After") or "?"
            return Outcome(
                action,
                Result.SKIPPED,
                f"API server throttled the eviction (HTTP 429, Retry-After {wait}s): retried next cycle",
            )
        if exc.status in (404, 409):
            return Outcome(action, Result.SKIPPED, f"pod gone or replaced (HTTP {exc.status})")
        return Outcome(action, Result.FAILED, f"HTTP {exc.status}: {_reason(exc) or exc.reason}")
    return Outcome(action, Result.DONE)


def _settle_eviction(core: client.CoreV1Api, action: EvictPod, why: str) -> Outcome:
    """The eviction failed ambiguously (``why``): the API server may have accepted it. Re-read the
    pod: gone, replaced or terminating is DONE; still there and not terminating is FAILED (retried);
    no answer is UNKNOWN, counted against the budgets as an eviction."""
    try:  # a LIST by name: the operator's role may list pods, not get them
        found: Any = core.list_namespaced_pod(
            action.namespace, field_selector=f"metadata.name={action.name}", _preload_content=False
        )
        items = orjson.loads(found.data).get("items") or []
    except (ApiException, HTTPError, OSError, orjson.JSONDecodeError, AttributeError, TypeError) as exc:
        return Outcome(action, Result.UNKNOWN, f"{why}, and the re-read failed: {describe(exc)}")
    if not items:
        return Outcome(action, Result.DONE, f"evicted (the API answered {why}; the pod is gone)")
    meta = (items[0].get("metadata") or {}) if isinstance(items[0], dict) else {}
    if meta.get("uid") != action.uid or meta.get("deletionTimestamp"):
        return Outcome(action, Result.DONE, f"evicted (the API answered {why}; the pod is terminating)")
    return Outcome(action, Result.FAILED, f"{why}; the re-read shows the pod still running: retried")


def _status(exc: ApiException) -> dict[str, Any]:
    try:
        doc = orjson.loads(exc.body or "{}")
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _budget_refusal(exc: ApiException) -> bool:
    """Is this 429 a PodDisruptionBudget's refusal (a ``DisruptionBudget`` cause, or the Eviction
    API's message), not API Priority and Fairness throttling the request (``Retry-After``, no cause)?"""
    doc = _status(exc)
    causes = (doc.get("details") or {}).get("causes") or []
    if any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes):
        return True
    return "disruption budget" in str(doc.get("message", "")).lower()


def _reason(exc: ApiException) -> str:
    doc = _status(exc)
    causes = (doc.get("details") or {}).get("causes") or []
    parts = [c.get("message", "") for c in causes] or [doc.get("message", "")]
    return "; ".join(p for p in parts if p)
