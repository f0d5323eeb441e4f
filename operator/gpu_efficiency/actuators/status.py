"""Write the policy's status subresource, and only when it says something new.

Accumulating counters (idle GPU-hours, waste) and the evaluation time change every cycle; writing
them each cycle would make a steady cluster busy. They are written with any other change, or at
most every ``refresh_seconds``.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus

VOLATILE_FIELDS = frozenset({"lastEvaluationTime", "idleGpuHours", "estimatedWasteTotal"})


def status_body(status: GPUEfficiencyPolicyStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json")


def _stable(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}


class StatusWriter:
    """Remembers what it last wrote per policy to skip no-op and merely-volatile writes."""

    def __init__(self, api_client: client.ApiClient, refresh_seconds: float = 300.0) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.refresh_seconds = refresh_seconds
        self._last: dict[str, tuple[dict[str, Any], float]] = {}
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

    def write(self, name: str, status: GPUEfficiencyPolicyStatus, *, force: bool = False) -> bool:
        body = status_body(status)
        if not force and not self.needs_write(name, body):
            return False
        try:
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, {"status": body}, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            if exc.status == 404:  # policy deleted meanwhile
                self._last.pop(name, None)
                return False
            raise
        self._last[name] = (body, time.monotonic())
        self.writes += 1
        return True

    def forget(self, name: str) -> None:
        self._last.pop(name, None)
