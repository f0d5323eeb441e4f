"""Node writes for fault quarantine: our taint, the GPUHealthy/GPUDegraded conditions, the fault record.

Taints are a read-modify-write of the whole list (``spec.taints`` is atomic) sent as a strategic
merge patch carrying ``metadata.resourceVersion``: the API server answers 409 Conflict when the
node changed since the read, and the write is retried on a fresh read a bounded number of times.
Only taints with our key are edited, and only the kind named by the action (see
``engine/quarantine/taints``: kinds sharing an effect share one taint, ``ecc.xid:NoSchedule``). Every
function reads first and skips the write when nothing would change (``Result.NOOP``), so a steady
state costs reads only. Dry run is the Applier's alone (``actuators/apply.py``): it never calls these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api.names import FAULT_TAINT_KEY
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import Action, AnnotateNode, SetNodeCondition, TaintNode, UntaintNode
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.engine.quarantine.taints import join_kinds, split_kinds

#: Reads and writes one node write may take when others keep changing the node.
MAX_ATTEMPTS = 5

TaintDict = dict[str, Any]


class NodeApi(Protocol):
    """The few CoreV1Api methods used here (a fake implements them in unit tests)."""

    def read_node(self, name: str) -> Any: ...

    def patch_node(self, name: str, body: Any) -> Any: ...

    def patch_node_status(self, name: str, body: Any) -> Any: ...


def _taint_dict(taint: Any) -> TaintDict:
    """A V1Taint as the API's JSON, keeping every field (timeAdded matters to NoExecute)."""
    out: TaintDict = {"key": taint.key, "effect": taint.effect}
    if taint.value is not None:
        out["value"] = taint.value
    if taint.time_added is not None:
        added = taint.time_added
        out["timeAdded"] = added if isinstance(added, str) else format_rfc3339(added)
    return out


def _taints(node: Any) -> list[TaintDict]:
    spec = getattr(node, "spec", None)
    return [_taint_dict(t) for t in (getattr(spec, "taints", None) or [])]


def with_kind(taints: list[TaintDict], kind: str, effect: str, now: float) -> list[TaintDict] | None:
    """Taints with ``kind`` in our key's ``effect`` taint (moved from any other), or None if so already."""
    holders = [
        t["effect"] for t in taints if t["key"] == FAULT_TAINT_KEY and kind in split_kinds(t.get("value", ""))
    ]
    if holders == [effect]:
        return None
    out: list[TaintDict] = []
    placed = False
    for taint in taints:
        kinds = split_kinds(taint.get("value", ""))
        if taint["key"] != FAULT_TAINT_KEY or (kind not in kinds and taint["effect"] != effect):
            out.append(taint)
            continue
        remaining = [k for k in kinds if k != kind]
        if taint["effect"] == effect:
            remaining.append(kind)
            placed = True
        if remaining:
            out.append({**taint, "value": join_kinds(remaining)})
    if not placed:
        out.append(
            {"key": FAULT_TAINT_KEY, "value": kind, "effect": effect, "timeAdded": format_rfc3339(now)}
        )
    return out


def without_kind(taints: list[TaintDict], kind: str) -> list[TaintDict] | None:
    """Taints with ``kind`` removed from our key's values (a taint left empty goes), or None if absent."""
    out: list[TaintDict] = []
    changed = False
    for taint in taints:
        kinds = split_kinds(taint.get("value", ""))
        if taint["key"] != FAULT_TAINT_KEY or kind not in kinds:
            out.append(taint)
            continue
        changed = True
        remaining = [k for k in kinds if k != kind]
        if remaining:
            out.append({**taint, "value": join_kinds(remaining)})
    return out if changed else None


_SERIALIZER = client.ApiClient()


def as_json(written: Any) -> Mapping[str, Any] | None:
    """What a write returned (a client model), as the API's JSON for the watch cache's views."""
    if written is None or isinstance(written, Mapping):
        return written
    if isinstance(written, client.V1Node):
        doc: Mapping[str, Any] = _SERIALIZER.sanitize_for_serialization(written)  # type: ignore[no-untyped-call]
        return doc
    return None


def _error(action: Action, exc: ApiException) -> Outcome:
    if exc.status == 404:
        return Outcome(action, Result.SKIPPED, "node not found")
    return Outcome(action, Result.FAILED, f"HTTP {exc.status}: {exc.reason}")


def _read_modify_write(
    core: NodeApi,
    action: Action,
    node_name: str,
    build: Callable[[Any], dict[str, Any] | None],
    write: Callable[[str, Any], Any],
    *,
    what: str,
    max_attempts: int,
) -> Outcome:
    """Read, build a patch from what was read (None: nothing to do), write with the resourceVersion."""
    for _ in range(max(1, max_attempts)):
        try:
            node = core.read_node(node_name)
        except ApiException as exc:
            return _error(action, exc)
        patch = build(node)
        if patch is None:
            return Outcome(action, Result.NOOP, f"{what}: already so")
        patch.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
        try:
            written = write(node_name, patch)
        except ApiException as exc:
            if exc.status == 409:
                continue
            return _error(action, exc)
        return Outcome(action, Result.DONE, what, obj=as_json(written))
    return Outcome(action, Result.FAILED, f"{what}: conflict after {max_attempts} attempts")


def apply_taint(core: NodeApi, action: TaintNode, *, max_attempts: int = MAX_ATTEMPTS) -> Outcome:
    """Make our taint carry ``action.kind`` with ``action.effect``; others' taints are kept as read."""

    def build(node: Any) -> dict[str, Any] | None:
        taints = with_kind(_taints(node), action.kind, action.effect, time.time())
        return None if taints is None else {"spec": {"taints": taints}}

    what = f"taint {FAULT_TAINT_KEY}={action.kind}:{action.effect}"
    return _read_modify_write(
        core,
        action,
        action.node,
        build,
        core.patch_node,
        what=what,
        max_attempts=max_attempts,
    )


def remove_taint(core: NodeApi, action: UntaintNode, *, max_attempts: int = MAX_ATTEMPTS) -> Outcome:
    """Remove ``action.kind`` from our taint (the taint goes when no kind is left); nothing else."""

    def build(node: Any) -> dict[str, Any] | None:
        taints = without_kind(_taints(node), action.kind)
        return None if taints is None else {"spec": {"taints": taints}}

    what = f"remove {action.kind} from taint {FAULT_TAINT_KEY}"
    return _read_modify_write(
        core,
        action,
        action.node,
        build,
        core.patch_node,
        what=what,
        max_attempts=max_attempts,
    )


def _condition(node: Any, type_: str) -> Any:
    status = getattr(node, "status", None)
    return next((c for c in (getattr(status, "conditions", None) or []) if c.type == type_), None)


def set_gpu_healthy_condition(
    core: NodeApi,
    action: SetNodeCondition,
    now: float | datetime,
    *,
    max_attempts: int = MAX_ATTEMPTS,
) -> Outcome:
    """Set the action's condition (GPUHealthy or GPUDegraded) by a strategic merge on
    ``status.conditions`` (merged by type).

    No write when status, reason and message are unchanged (heartbeat included: a steady state is
    write-free). ``lastTransitionTime`` is kept while the status holds, even if the reason changes.
    """

    def build(node: Any) -> dict[str, Any] | None:
        current = _condition(node, action.type)
        if current is not None and (current.status, current.reason or "", current.message or "") == (
            action.status,
            action.reason,
            action.message,
        ):
            return None
        transition: float | datetime | str = now
        if (
            current is not None
            and current.status == action.status
            and current.last_transition_time is not None
        ):
            transition = current.last_transition_time
        condition = {
            "type": action.type,
            "status": action.status,
            "reason": action.reason,
            "message": action.message,
            "lastTransitionTime": transition if isinstance(transition, str) else format_rfc3339(transition),
            "lastHeartbeatTime": format_rfc3339(now),
        }
        return {"status": {"conditions": [condition]}}

    what = f"set {action.type}={action.status} ({action.reason})"
    return _read_modify_write(
        core,
        action,
        action.node,
        build,
        core.patch_node_status,
        what=what,
        max_attempts=max_attempts,
    )


def annotation_changes(current: Mapping[str, str], wanted: Mapping[str, str | None]) -> dict[str, str | None]:
    """The part of ``wanted`` that differs from ``current`` (None: remove, if present)."""
    return {k: v for k, v in wanted.items() if (current.get(k) if k in current else None) != v}


def annotate_node(core: NodeApi, action: AnnotateNode) -> Outcome:
    """Merge the annotations (None removes a key) when any differs; only the keys named are touched."""
    try:
        node = core.read_node(action.node)
    except ApiException as exc:
        return _error(action, exc)
    changes = annotation_changes(getattr(node.metadata, "annotations", None) or {}, action.annotations)
    if not changes:
        return Outcome(action, Result.NOOP, "annotations already so")
    what = f"annotate {', '.join(sorted(changes))}"
    try:
        written = core.patch_node(action.node, {"metadata": {"annotations": changes}})
    except ApiException as exc:
        return _error(action, exc)
    return Outcome(action, Result.DONE, what, obj=as_json(written))
