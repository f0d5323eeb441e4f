"""The optional ``GPUHealthy`` node condition, written by the agent itself (as node-problem-detector does).

The operator then sees a fault through a node watch without waiting for a scrape and a policy cycle.
``desired_condition`` and ``condition_patch`` are pure; ``NodeConditionWriter`` does the Kubernetes I/O
(patch nodes/status, strategic merge keyed by condition type, so other conditions are untouched). It
writes only when status, reason or message change, and keeps ``lastTransitionTime`` while the status
stays the same. Needs RBAC: get and patch on ``nodes/status`` for its own node.

The operator writes the same condition for the faults it holds (reasons ``GPUFault*``). To never fight it,
the agent leaves alone a False it did not write, and does not rewrite one True with another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpu_efficiency.agent.faults import FaultEvent
from gpu_efficiency.agent.runtime import Agent
from gpu_efficiency.agent.state import GpuView
from gpu_efficiency.api.timefmt import format_rfc3339

log = logging.getLogger(__name__)

CONDITION_TYPE = "GPUHealthy"  # api.names.GPU_HEALTHY; a unit test keeps them equal
HEALTHY, NVML_UNAVAILABLE = "GPUsHealthy", "NVMLUnavailable"
XID, DBE, REMAP = "XidCriticalError", "EccDoubleBitError", "RowRemapFailure"
AGENT_REASONS = frozenset({HEALTHY, NVML_UNAVAILABLE, XID, DBE, REMAP})


@dataclass(frozen=True, slots=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def desired_condition(
    views: Sequence[GpuView], *, ready: bool, ready_reason: str, critical_xids: Collection[int]
) -> Condition:
    """False naming each faulty GPU (index and UUID) on a critical XID, a double-bit ECC error or a failed
    row remap; Unknown while NVML is unavailable; True otherwise."""
    if not ready:
        return Condition("Unknown", NVML_UNAVAILABLE, ready_reason)
    problems: list[tuple[int, str, str]] = []  # (priority, reason, message)
    physical = [v for v in views if not v.reading.device.is_mig]
    for v in physical:
        d, f, values = v.reading.device, v.faults, v.reading.values
        gpu = f"GPU {d.label_index} ({d.uuid})"
        critical = [x for x in f.xid_codes if x in critical_xids]
        if critical:
            problems.append((0, XID, f"{gpu}: critical XID {', '.join(map(str, critical))}"))
        dbe = max(f.dbe_events, int(values.get("ecc_dbe_volatile", 0)))
        if dbe:
            problems.append((1, DBE, f"{gpu}: {dbe} double-bit ECC error(s)"))
        if values.get("row_remap_failure"):
            problems.append((2, REMAP, f"{gpu}: row remapping failed"))
    if problems:
        problems.sort(key=lambda p: p[0])
        return Condition("False", problems[0][1], "; ".join(p[2] for p in problems))
    return Condition("True", HEALTHY, f"{len(physical)} GPU(s) without XID, double-bit ECC or remap faults")


def condition_patch(desired: Condition, current: Mapping[str, str] | None, now: str) -> dict[str, Any] | None:
    """The nodes/status patch, or None: when the node already says the same, when another writer (the
    operator) holds it False, or when it is True already (a healthy message is not worth a write)."""
    if current is not None:
        said = (current.get("status"), current.get("reason"), current.get("message"))
        if said == (desired.status, desired.reason, desired.message):
            return None
        if said[0] == "False" and said[1] not in AGENT_REASONS:
            return None
        if said[0] == desired.status == "True":
            return None
    same_status = current is not None and current.get("status") == desired.status
    transition = current.get("lastTransitionTime") if current is not None and same_status else None
    condition = {
        "type": CONDITION_TYPE,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "lastTransitionTime": transition or now,
        "lastHeartbeatTime": now,
    }
    return {"status": {"conditions": [condition]}}


def _rfc3339(value: object) -> str | None:
    if isinstance(value, datetime):
        return format_rfc3339(value.astimezone(UTC))
    return None if value is None else str(value)


class NodeConditionWriter:
    """Keeps GPUHealthy in step with the agent: on each fault event and every ``resync_s``."""

    def __init__(
        self, agent: Agent, node: str, critical_xids: Collection[int] | None = None, resync_s: float = 30.0
    ) -> None:
        from kubernetes import client

        from gpu_efficiency.apiclient import load_api_client

        if critical_xids is None:
            from gpu_efficiency.api.policy import DEFAULT_CRITICAL_XIDS

            critical_xids = DEFAULT_CRITICAL_XIDS
        self._api = client.CoreV1Api(load_api_client(pool_size=1))
        self._agent = agent
        self._node = node
        self._critical = frozenset(critical_xids)
        self._resync_s = resync_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-condition", daemon=True)
        agent.add_fault_listener(self._on_fault)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def sync(self) -> bool:
        """One read-compare-patch round; True when a patch was sent."""
        ready, reason = self._agent.readiness()
        desired = desired_condition(
            self._agent.views(), ready=ready, ready_reason=reason, critical_xids=self._critical
        )
        node = self._api.read_node_status(self._node)
        conditions = (node.status.conditions if node.status else None) or ()
        current = next((c for c in conditions if c.type == CONDITION_TYPE), None)
        current_map = (
            None
            if current is None
            else {
                "status": str(current.status),
                "reason": str(current.reason or ""),
                "message": str(current.message or ""),
                "lastTransitionTime": _rfc3339(current.last_transition_time) or "",
            }
        )
        now = format_rfc3339(datetime.now(UTC))
        patch = condition_patch(desired, current_map, now)
        if patch is None:
            return False
        self._api.patch_node_status(self._node, patch, _content_type="application/strategic-merge-patch+json")
        log.info(
            "node %s: %s=%s (%s) %s",
            self._node,
            CONDITION_TYPE,
            desired.status,
            desired.reason,
            desired.message,
        )
        return True

    def _on_fault(self, _event: FaultEvent) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wrote = self.sync()
                self._agent.metrics.node_condition_writes.labels("written" if wrote else "unchanged").inc()
            except Exception as exc:  # API down, RBAC: keep sampling, retry at the next resync
                self._agent.metrics.node_condition_writes.labels("error").inc()
                log.warning("node %s: could not update %s: %s", self._node, CONDITION_TYPE, exc)
            self._wake.wait(self._resync_s)
            self._wake.clear()
