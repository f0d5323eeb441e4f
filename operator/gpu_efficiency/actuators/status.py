"""Write the policy's status subresource, and only when it says something new.

Accumulating counters (idle GPU-hours, waste) and the evaluation time change every cycle; writing
them each cycle would make a steady cluster busy. They are written with any other change, or at
most every ``refresh_seconds``.

Writes carry the policy's ``resourceVersion`` (from the last read or write): a status another
replica wrote meanwhile makes the API server answer 409 Conflict rather than be overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus

VOLATILE_FIELDS = frozenset({"lastEvaluationTime", "idleGpuHours", "estimatedWasteTotal", "gpuHoursReturned"})
#: In each status.reclamations record: the GPU-hours it has returned so far, which grow every cycle.
VOLATILE_RECORD_FIELDS = frozenset({"gpuHoursReturned"})


def status_body(status: GPUEfficiencyPolicyStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json")


def parse_status(raw: Mapping[str, Any]) -> GPUEfficiencyPolicyStatus:
    """The status as this version models it (unknown fields ignored; unreadable ones dropped)."""
    return read_status(raw)[0]


def read_status(raw: Mapping[str, Any]) -> tuple[GPUEfficiencyPolicyStatus, list[str]]:
    """The status, each field read on its own, and what could not be read.

    A status the CRD's schema accepts can still fail the model in one field (``reclamations: [{}]``);
    read whole, that one field would drop the others with it, above all ``recentEvictions`` (the
    hour's eviction budget) and the reclamation records ``restore`` relies on. So a bad field is
    dropped alone, and in a list only its bad items."""
    fields = _FIELDS
    good: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items() if isinstance(raw, Mapping) else ():
        if key not in fields:
            continue
        error = _field_error(key, value)
        if not error:
            good[key] = value
        elif isinstance(value, list):
            kept = []
            for i, item in enumerate(value):
                item_error = _field_error(key, [item])
                if item_error:
                    problems.append(f"status.{key}[{i}]: {item_error}")
                else:
                    kept.append(item)
            good[key] = kept
        else:
            problems.append(f"status.{key}: {error}")
    try:
        return GPUEfficiencyPolicyStatus.model_validate(good), problems
    except ValidationError as exc:  # unreachable: every field passed alone; never lose the budget
        return GPUEfficiencyPolicyStatus(), [*problems, f"status: {_first(exc)}"]


_FIELDS = frozenset(GPUEfficiencyPolicyStatus.model_json_schema(by_alias=True)["properties"])


def _field_error(key: str, value: Any) -> str:
    try:
        GPUEfficiencyPolicyStatus.model_validate({key: value})
    except ValidationError as exc:
        return _first(exc)
    return ""


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ())[1:])
    return f"{where + ': ' if where else ''}{error.get('msg', 'invalid')}"


def _stable(body: dict[str, Any]) -> dict[str, Any]:
    """The status without what grows every cycle: a change there alone waits for the refresh."""
    stable = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
    if isinstance(stable.get("reclamations"), list):
        stable["reclamations"] = [
            {k: v for k, v in r.items() if k not in VOLATILE_RECORD_FIELDS} if isinstance(r, dict) else r
            for r in stable["reclamations"]
        ]
    return stable


class StatusWriter:
    """Remembers what it last wrote per policy to skip no-op and merely-volatile writes."""

    def __init__(self, api_client: client.ApiClient, refresh_seconds: float = 300.0) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.refresh_seconds = refresh_seconds
        self._last: dict[str, tuple[dict[str, Any], float]] = {}
        self._versions: dict[str, str] = {}  # resourceVersion of each policy as last read or written
        #: Status fields (or list items) dropped as unreadable when the status was last read, per
        #: policy, until the cycle reports them (StatusValid condition, StatusFieldInvalid event).
        self.problems: dict[str, list[str]] = {}
        self.writes = 0

    def needs_write(self, name: str, body: dict[str, Any], now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        previous = self._last.get(name)
        if previous is None:
            return True
        last_body, written_at = previous
        if _stable(last_body) != _stable(body):
            return True
        return body != last_body and now - written_at >= self.refresh_seconds

    def seed(self, name: str, current: dict[str, Any]) -> None:
        """Start from the status already on the server (after a restart), so no write is needed."""
        if name not in self._last and current:
            self._last[name] = (current, time.monotonic())

    def read(self, name: str) -> GPUEfficiencyPolicyStatus | None:
        """The policy's status as the server has it now (None: the policy is gone). Its version is
        kept for the next write, and its content as what the server holds."""
        try:
            obj: Any = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                self.forget(name)
                return None
            raise
        self._remember_version(name, obj)
        status, problems = read_status(obj.get("status") or {})
        if problems:
            self.problems[name] = problems
        self._last[name] = (status_body(status), time.monotonic())
        return status

    def write(self, name: str, status: GPUEfficiencyPolicyStatus, *, force: bool = False) -> bool:
        """Write when needed; raises ApiException 409 when the policy changed since it was last read."""
        body = status_body(status)
        if not force and not self.needs_write(name, body):
            return False
        patch: dict[str, Any] = {"status": body}
        if name in self._versions:
            patch["metadata"] = {"resourceVersion": self._versions[name]}
        try:
            written: Any = self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            if exc.status == 404:  # policy deleted meanwhile
                self.forget(name)
                return False
            raise
        self._remember_version(name, written)
        self._last[name] = (body, time.monotonic())
        self.writes += 1
        return True

    def _remember_version(self, name: str, obj: Any) -> None:
        version = (
            ((obj or {}).get("metadata") or {}).get("resourceVersion") if isinstance(obj, Mapping) else None
        )
        if version:
            self._versions[name] = str(version)
        else:  # unknown: the next write goes without a precondition rather than with a stale one
            self._versions.pop(name, None)

    def forget(self, name: str) -> None:
        self._last.pop(name, None)
        self._versions.pop(name, None)
