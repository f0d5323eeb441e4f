"""Early fault cycles: a node agent's ``GPUHealthy=False`` wakes the policies covering its node.

Without it a fault waits for the next policy cycle (up to ``spec.interval``) even when the agent has
seen the NVML event within a second and written the node condition. The node watch notices that
write; the policies whose faults cover the node (faults enabled, ``metrics.nodeAgent``, node selector
matching) run their cycle early, and that cycle reads the XID/ECC facts from the agents' snapshots.

The condition is only a wake-up call, never evidence: the early cycle is an ordinary cycle, judged
by the same catalogue, repeat counting and circuit breaker from the samples. A condition written by
someone else (or one the agent's snapshot contradicts) costs at most one cycle and taints nothing.

Bounds: wakes that arrive before the cycle runs coalesce into one, and a policy runs at most one early
cycle per ``min_gap`` seconds (a flood across many nodes runs cycles no more often than that). A
report the agent already made on that node wakes nothing: the agent writes its False again after
the operator's recovery sets True (it keeps every critical XID since it started), and such a repeat
holds no new fault but would spend the gap a new one may need.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpu_efficiency import metrics
from gpu_efficiency.api.names import GPU_HEALTHY
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.engine import compile_selector
from gpu_efficiency.engine.model import NodeCondition, NodeView

log = logging.getLogger(__name__)

#: The reasons the node agent writes with ``GPUHealthy=False`` (agent/nodecondition.py; a unit test
#: keeps them equal). The operator's own ``GPUFault*`` reasons and other writers' wake nothing.
AGENT_FAULT_REASONS = frozenset({"XidCriticalError", "EccDoubleBitError", "RowRemapFailure"})
#: Default least seconds between two early cycles of one policy (--fault-wake-min-gap).
DEFAULT_MIN_GAP = 2.0


def _gpu_healthy(node: NodeView | None) -> NodeCondition | None:
    if node is None:
        return None
    return next((c for c in node.conditions if c.type == GPU_HEALTHY), None)


def agent_fault_news(before: NodeView | None, after: NodeView | None) -> bool:
    """Did the node agent just report a fault: ``GPUHealthy`` is False with an agent reason and its
    status, reason or message differs from before (a second GPU failing changes the message)?"""
    new = _gpu_healthy(after)
    if new is None or new.status != "False" or new.reason not in AGENT_FAULT_REASONS:
        return False
    old = _gpu_healthy(before)
    return old is None or (old.status, old.reason, old.message) != (new.status, new.reason, new.message)


def covers(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Does this policy judge faults on a node with these labels from the node agents?"""
    try:
        parsed = GPUEfficiencyPolicySpec.model_validate(dict(spec))
    except ValidationError:
        return False  # an invalid policy acts on nothing
    return (
        parsed.faults.enabled
        and parsed.metrics.node_agent
        and compile_selector(parsed.selection.node_selector)(labels)
    )


@dataclass(frozen=True, slots=True)
class PolicyRef:
    name: str
    spec: Mapping[str, Any]


class FaultWake:
    """Which policies to run early, bounded per policy; thread-safe (the node watch's thread asks,
    the scheduler's thread takes)."""

    def __init__(self, min_gap: float = DEFAULT_MIN_GAP, clock: Callable[[], float] = time.monotonic) -> None:
        if not min_gap > 0:
            raise ValueError(f"the least gap between early fault cycles must be positive, not {min_gap}")
        self.min_gap = min_gap
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}  # policy -> when its early cycle may run
        self._last_early: dict[str, float] = {}  # policy -> when its last early cycle was taken
        self._reported: dict[str, tuple[str, str]] = {}  # node -> the agent's last (reason, message)

    def node_changed(
        self, before: NodeView | None, after: NodeView | None, policies: Iterable[PolicyRef]
    ) -> list[str]:
        """Request an early cycle of every policy covering ``after`` when its agent reported a fault;
        the policies newly requested (one already pending coalesces)."""
        if after is None or not agent_fault_news(before, after):
            return []
        condition = _gpu_healthy(after)
        if condition is None:  # agent_fault_news found one: for the type checker
            return []
        report = (condition.reason, condition.message)
        with self._lock:
            if self._reported.get(after.name) == report:
                return []  # the same report again (after a recovery): nothing new to judge
            self._reported[after.name] = report
        now = self._clock()
        woken: list[str] = []
        for policy in policies:
            if not covers(policy.spec, after.labels):
                continue
            with self._lock:
                if policy.name in self._pending:
                    metrics.FAULT_WAKES.labels(policy.name, "coalesced").inc()
                    continue
                last = self._last_early.get(policy.name)
                self._pending[policy.name] = now if last is None else max(now, last + self.min_gap)
            metrics.FAULT_WAKES.labels(policy.name, "requested").inc()
            woken.append(policy.name)
        if woken:
            log.info(
                "node %s: GPUHealthy=False, the node agent's reason %s (%s): early fault cycle of %s",
                after.name,
                condition.reason,
                condition.message[:300],
                ", ".join(woken),
            )
        return woken

    def take_due(self) -> set[str]:
        """The policies whose early cycle may run now; each is taken once."""
        now = self._clock()
        with self._lock:
            due = {name for name, at in self._pending.items() if at <= now}
            for name in due:
                del self._pending[name]
                self._last_early[name] = now
            return due

    def next_due(self) -> float | None:
        """When the earliest pending early cycle may run (None: none pending)."""
        with self._lock:
            return min(self._pending.values(), default=None)

    def forget(self, policy: str) -> None:
        with self._lock:
            self._pending.pop(policy, None)
            self._last_early.pop(policy, None)
